"""Tokenised task splits, length-bucketed batching and dynamic padding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import datasets
import numpy as np
import torch
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase

from harness.data.tasks import TaskSpec


@dataclass
class EncodedSplit:
    """A tokenised split held as per-example id arrays; padding happens per batch."""

    name: str
    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray
    lengths: np.ndarray
    texts: list[tuple[str, ...]] | None = None
    """The raw text fields of every row (one, or two for sentence pairs)."""
    features: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """A student's own per-row inputs (e.g. word ids of a non-BERT student), padded with 0
    per batch into ``batch[name]`` beside ``batch[name + "_lengths"]``."""
    has_gold: np.ndarray | None = None
    """False for synthetic rows, whose ``labels`` are only their source row's (None: every
    row has its gold label)."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def texts_by_field(self) -> tuple[list[str], list[str] | None]:
        """``(first texts, second texts or None)`` of every row."""
        if self.texts is None:
            raise ValueError(f"split {self.name!r} was encoded without its texts")
        first = [fields[0] for fields in self.texts]
        second = ([fields[1] for fields in self.texts]
                  if self.texts and len(self.texts[0]) > 1 else None)
        return first, second

    def subset(self, rows: Sequence[int], name: str | None = None) -> EncodedSplit:
        """The given rows, in that order (features and texts included)."""
        rows = [int(row) for row in rows]
        return EncodedSplit(
            name=name or self.name,
            input_ids=[self.input_ids[row] for row in rows],
            token_type_ids=[self.token_type_ids[row] for row in rows],
            labels=self.labels[rows], lengths=self.lengths[rows],
            texts=[self.texts[row] for row in rows] if self.texts is not None else None,
            features={key: [values[row] for row in rows]
                      for key, values in self.features.items()},
            has_gold=self.has_gold[rows] if self.has_gold is not None else None)

    def with_features(self, features: dict[str, Sequence[np.ndarray]]) -> EncodedSplit:
        """A copy carrying ``features`` (one array per row for each name)."""
        for name, rows in features.items():
            if len(rows) != len(self):
                raise ValueError(f"feature {name!r} has {len(rows)} rows; split "
                                 f"{self.name!r} has {len(self)}")
        return replace(self, features={name: list(rows) for name, rows in features.items()})


def encode_split(name: str, split: datasets.Dataset, task: TaskSpec,
                 tokenizer: PreTrainedTokenizerBase, max_length: int) -> EncodedSplit:
    texts_b = list(split["text_b"]) if task.is_pair else None
    encoded = tokenizer(list(split["text_a"]), texts_b, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=True)
    input_ids = [np.asarray(ids, dtype=np.int64) for ids in encoded["input_ids"]]
    token_types = [np.asarray(ids, dtype=np.int64) for ids in encoded["token_type_ids"]]
    label_dtype = np.float32 if task.is_regression else np.int64
    texts_a = list(split["text_a"])
    texts = (list(zip(texts_a, texts_b, strict=True)) if texts_b is not None
             else [(text,) for text in texts_a])
    return EncodedSplit(
        name=name,
        input_ids=input_ids,
        token_type_ids=token_types,
        labels=np.asarray(list(split["label"]), dtype=label_dtype),
        lengths=np.asarray([len(ids) for ids in input_ids], dtype=np.int64),
        texts=texts,
    )


def padding_multiple(device: torch.device) -> int:
    """What a batch's width is rounded up to on ``device``.

    8 on a GPU, where bf16 matrix products pay a slow first call for each new batch width:
    rounding leaves at most 16 widths up to 128 tokens (measurements:
    notes/2026-11-27-benchmarks-log.md, "On a GPU: one NVIDIA H200").  1 elsewhere: on a
    CPU a width costs its arithmetic alone, so rounding would only add the padding's compute:
    a CPU batch stays exactly as wide as its longest row."""
    return 8 if device.type == "cuda" else 1


class PaddingCollator:
    """Pads a list of row indices of one split to the longest row in the batch, rounded up
    to a multiple of ``multiple_of`` (masked positions, so no model output changes).

    Training, evaluation and the teacher's outputs take :func:`padding_multiple` of their
    device."""

    def __init__(self, split: EncodedSplit, pad_token_id: int = 0, multiple_of: int = 1) -> None:
        self.split = split
        self.pad_token_id = pad_token_id
        self.multiple_of = multiple_of

    def __call__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        longest = int(self.split.lengths[rows].max())
        width = -(-longest // self.multiple_of) * self.multiple_of
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        token_type_ids = np.zeros((len(rows), width), dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        for position, row in enumerate(rows):
            length = self.split.lengths[row]
            input_ids[position, :length] = self.split.input_ids[row]
            token_type_ids[position, :length] = self.split.token_type_ids[row]
            attention_mask[position, :length] = 1
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(self.split.labels[rows]),
            "row": torch.as_tensor(rows, dtype=torch.long),
        }
        if self.split.has_gold is not None:
            batch["has_gold"] = torch.from_numpy(self.split.has_gold[rows])
        for name, feature in self.split.features.items():
            batch.update(pad_feature(name, [feature[row] for row in rows]))
        return batch


def pad_feature(name: str, rows: Sequence[np.ndarray]) -> dict[str, torch.Tensor]:
    """A student's own per-row ids as a batch: ``name`` zero-padded to the longest row,
    and ``name + "_lengths"``."""
    lengths = np.asarray([len(row) for row in rows], dtype=np.int64)
    padded = np.zeros((len(rows), max(1, int(lengths.max()))), dtype=np.int64)
    for position, row in enumerate(rows):
        padded[position, :lengths[position]] = row
    return {name: torch.from_numpy(padded), f"{name}_lengths": torch.from_numpy(lengths)}


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
        self.first_batch = 0
        if rows_per_epoch is not None and not shuffle:
            raise ValueError("rows_per_epoch draws a random subset: it needs shuffle=True")
        self.rows_per_epoch = (min(rows_per_epoch, len(lengths)) if rows_per_epoch
                               else len(lengths))
        """An epoch is a fresh random draw of this many rows (all rows by default)."""

    def set_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """The epoch's order, from its ``first_batch``-th batch on (a resumed stage skips
        the ones it trained on without collating them)."""
        self.epoch = epoch
        self.first_batch = first_batch

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
        for index in rng.permutation(len(batches))[self.first_batch:]:
            yield batches[index].tolist()
