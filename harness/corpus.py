"""The unlabeled corpus of general distillation.

Offline default: the unique sentences of the suite's training sets (both sides of a pair;
labels are never read), plus any text files given; on machines online, a hub text dataset
(e.g. wikitext) can be added.  The corpus is fingerprinted by content, so the general
distillation it feeds is cached once for every task and seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from harness.config import CorpusConfig
from harness.data import DataNotFoundError, TaskData
from harness.features import EncodedSplit


@dataclass
class Corpus:
    sentences: list[str]
    fingerprint: str
    sources: list[str]

    def __len__(self) -> int:
        return len(self.sentences)


def _task_sentences(data: TaskData) -> Iterable[str]:
    train = data.splits["train"]
    yield from train["text_a"]
    if data.task.is_pair:
        yield from train["text_b"]


def _text_file_lines(path: Path) -> Iterable[str]:
    if not path.exists():
        raise DataNotFoundError(f"corpus text file {path} does not exist "
                                "(corpus.text_files in the suite)")
    with path.open(encoding="utf-8", errors="replace") as handle:
        yield from handle


def _hub_lines(config: CorpusConfig) -> Iterable[str]:
    import datasets

    spec = config.hub_dataset
    assert spec is not None
    dataset = datasets.load_dataset(spec.path, spec.name, split=spec.split)
    if spec.column not in dataset.column_names:
        raise ValueError(f"corpus.hub_dataset: {spec.path} has no column {spec.column!r}; "
                         f"it has {dataset.column_names}")
    yield from dataset[spec.column]


def build_corpus(config: CorpusConfig, tasks: list[TaskData]) -> Corpus:
    """Unique, whitespace-normalised lines of at least ``min_words`` words, in first-seen
    order, then a seeded sample of ``max_sentences`` if set."""
    seen: dict[str, None] = {}
    sources: list[str] = []

    def add(lines: Iterable[str]) -> None:
        for line in lines:
            text = " ".join(line.split())
            if len(text.split(" ")) >= config.min_words:
                seen.setdefault(text, None)

    if config.task_sentences:
        for data in tasks:
            add(_task_sentences(data))
            sources.append(f"task:{data.task.name}:{data.fingerprint[:12]}")
    for name in config.text_files:
        path = Path(name).expanduser()
        add(_text_file_lines(path))
        sources.append(f"file:{path}")
    if config.hub_dataset is not None:
        add(_hub_lines(config))
        spec = config.hub_dataset
        sources.append(f"hub:{spec.path}/{spec.name}/{spec.split}")
    sentences = list(seen)
    if not sentences:
        raise ValueError("the general-distillation corpus is empty: enable "
                         "corpus.task_sentences or give corpus.text_files / hub_dataset")
    if config.max_sentences is not None and len(sentences) > config.max_sentences:
        order = np.random.default_rng(config.seed).permutation(len(sentences))
        sentences = [sentences[i] for i in sorted(order[:config.max_sentences])]
    return Corpus(sentences, sentences_fingerprint(sentences), sources)


def sentences_fingerprint(sentences: Iterable[str]) -> str:
    """sha256 of the sentences in order, newline-separated."""
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def encode_corpus(corpus: Corpus, tokenizer: PreTrainedTokenizerBase,
                  max_length: int) -> EncodedSplit:
    """Single-segment encodings; labels are zeros (no stage reads them)."""
    encoded = tokenizer(corpus.sentences, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=True)
    input_ids = [np.asarray(ids, dtype=np.int64) for ids in encoded["input_ids"]]
    return EncodedSplit(
        name="corpus",
        input_ids=input_ids,
        token_type_ids=[np.asarray(ids, dtype=np.int64) for ids in encoded["token_type_ids"]],
        labels=np.zeros(len(input_ids), dtype=np.int64),
        lengths=np.asarray([len(ids) for ids in input_ids], dtype=np.int64),
    )
