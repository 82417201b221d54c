"""Tokenised task splits, length-bucketed batching and dynamic padding."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import datasets
import numpy as np
import torch
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase

from harness.tasks import TaskSpec


@dataclass
class EncodedSplit:
    """A tokenised split held as per-example id arrays; padding happens per batch."""

    name: str
    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_split(name: str, split: datasets.Dataset, task: TaskSpec,
                 tokenizer: PreTrainedTokenizerBase, max_length: int) -> EncodedSplit:
    texts_b = list(split["text_b"]) if task.is_pair else None
    encoded = tokenizer(list(split["text_a"]), texts_b, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=True)
    input_ids = [np.asarray(ids, dtype=np.int64) for ids in encoded["input_ids"]]
    token_types = [np.asarray(ids, dtype=np.int64) for ids in encoded["token_type_ids"]]
    label_dtype = np.float32 if task.is_regression else np.int64
    return EncodedSplit(
        name=name,
        input_ids=input_ids,
        token_type_ids=token_types,
        labels=np.asarray(list(split["label"]), dtype=label_dtype),
        lengths=np.asarray([len(ids) for ids in input_ids], dtype=np.int64),
    )


class PaddingCollator:
    """Pads a list of row indices of one split to the longest row in the batch."""

    def __init__(self, split: EncodedSplit, pad_token_id: int = 0) -> None:
        self.split = split
        self.pad_token_id = pad_token_id

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        width = int(self.split.lengths[rows].max())
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        token_type_ids = np.zeros((len(rows), width), dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        for position, row in enumerate(rows):
            length = self.split.lengths[row]
            input_ids[position, :length] = self.split.input_ids[row]
            token_type_ids[position, :length] = self.split.token_type_ids[row]
            attention_mask[position, :length] = 1
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(self.split.labels[rows]),
            "row": torch.as_tensor(rows, dtype=torch.long),
        }


class BucketBatchSampler(Sampler[list[int]]):
    """Shuffled batches of similar length, so dynamic padding wastes little compute.

    Rows are shuffled, cut into pools of ``pool_batches`` batches, sorted by length inside
    each pool, batched, and the batches shuffled again: the order stays random at the
    batch level while each batch is nearly pad-free.  ``shuffle=False`` gives
    length-sorted batches (evaluation), whose predictions are put back by row index.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, shuffle: bool, seed: int = 0,
                 pool_batches: int = 50, rows_per_epoch: int | None = None) -> None:
        self.lengths = lengths
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.pool_batches = pool_batches
        self.epoch = 0
        if rows_per_epoch is not None and not shuffle:
            raise ValueError("rows_per_epoch draws a random subset: it needs shuffle=True")
        self.rows_per_epoch = (min(rows_per_epoch, len(lengths)) if rows_per_epoch
                               else len(lengths))
        """An epoch is a fresh random draw of this many rows (all rows by default)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (self.rows_per_epoch + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")
            for start in range(0, len(order), self.batch_size):
                yield order[start : start + self.batch_size].tolist()
            return
        rng = np.random.default_rng((self.seed, self.epoch))
        order = rng.permutation(len(self.lengths))[:self.rows_per_epoch]
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i : i + self.batch_size] for i in range(0, len(chunk),
                                                                         self.batch_size))
        for index in rng.permutation(len(batches)):
            yield batches[index].tolist()
