"""Word-level text for non-BERT students: spaCy's English tokenizer, a vocabulary built from
training texts, and embedding tables initialised from word vectors (GloVe).

The tokenizer is spaCy's rule-based English tokenizer (no model needed), the one its
English pipelines use, so words split here exactly as the POS tagger of
:mod:`methods.bilstm_soft.pos` splits them; the mask token that augmentation writes (the
teacher's, ``[MASK]`` or RoBERTa's ``<mask>``) stays one token and is read as the
vocabulary's ``[MASK]`` word.  Words are lower-cased (GloVe 6B is uncased; the special
tokens keep their case).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from harness.api import (
    content_hash,
)
from harness.assets.glove import GloveVectors

PAD, UNK, MASK = "[PAD]", "[UNK]", "[MASK]"
SPECIALS = (PAD, UNK, MASK)
"""Rows 0, 1, 2 of every vocabulary: padding (zero vector), unknown words, the masked
word (what the teacher's mask token in an augmented text is read as)."""


SHIPPED_TOKENIZER = {"spacy": "3.8"}
"""The tokenizer of every run id made before run ids named it (the records in results/
included); :func:`tokenizer_run_identity` leaves it out, so those ids stay as they were."""


def tokenizer_run_identity() -> dict[str, str]:
    """The word tokenizer as a run id holds it: spaCy's minor version (its tokenizer rules
    change with minor releases, not patches), empty for :data:`SHIPPED_TOKENIZER`."""
    try:
        version = importlib.metadata.version("spacy")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    identity = {"spacy": ".".join(version.split(".")[:2])}
    return {} if identity == SHIPPED_TOKENIZER else identity


@functools.lru_cache(maxsize=4)
def _spacy_tokenizer(mask_token: str = MASK):
    try:
        import spacy
        from spacy.symbols import ORTH
    except ImportError:
        raise ImportError("word-level students tokenise with spaCy: pip install spacy") from None
    tokenizer = spacy.blank("en").tokenizer
    tokenizer.add_special_case(mask_token, [{ORTH: mask_token}])
    return tokenizer


def tokenize(texts: Iterable[str], batch_size: int = 1000,
             mask_token: str = MASK) -> list[list[str]]:
    """Lower-cased words of each text, ``mask_token`` (the teacher's mask token, which
    augmented copies carry) one word read as ``[MASK]``; spaces dropped."""
    tokenizer = _spacy_tokenizer(mask_token)
    return [[MASK if token.text == mask_token else token.lower_
             for token in doc if not token.is_space]
            for doc in tokenizer.pipe(texts, batch_size=batch_size)]


class WordVocabulary:
    """Words of the training texts (most frequent first, ties alphabetical) after the
    specials; ``min_count`` drops rarer words (they map to ``[UNK]``)."""

    def __init__(self, words: Sequence[str]) -> None:
        if tuple(words[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary starts with {SPECIALS}")
        self.words = list(words)
        self.index = {word: row for row, word in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("vocabulary words must be unique")

    @classmethod
    def build(cls, tokenized: Iterable[Sequence[str]], min_count: int = 1) -> WordVocabulary:
        counts = Counter(word for words in tokenized for word in words)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((word for word, count in counts.items() if count >= min_count),
                      key=lambda word: (-counts[word], word))
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, words: Sequence[str], max_words: int | None = None) -> np.ndarray:
        """Ids of ``words`` (truncated to ``max_words``); an empty text becomes ``[UNK]``
        so that every row has a length of at least 1."""
        if max_words is not None:
            words = words[:max_words]
        ids = np.fromiter((self.index.get(word, 1) for word in words), dtype=np.int64,
                          count=len(words))
        return ids if len(ids) else np.array([1], dtype=np.int64)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Hash of the word list (computed once: it keys every encoded split)."""
        return content_hash(self.words)


def embedding_matrix(vocabulary: WordVocabulary, vectors: GloveVectors,
                     generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, dict[str, Any]]:
    """Initial embedding table: each word's vector where ``vectors`` has it, else a random
    normal vector with the per-dimension spread of the found ones; ``[PAD]`` is zero.

    Returns the table and a summary (coverage) for run records.
    """
    found_matrix, found = vectors.lookup(vocabulary.words)
    found[0] = False
    table = torch.from_numpy(found_matrix.copy())
    std = (torch.from_numpy(found_matrix[found]).std(dim=0) if found.sum() > 1
           else torch.full((vectors.dim,), 0.5))
    missing = torch.from_numpy(~found)
    missing[0] = False
    count = int(missing.sum())
    table[missing] = torch.randn(count, vectors.dim, generator=generator) * std
    table[0] = 0.0
    words_found = int(found[len(SPECIALS):].sum())
    return table, {"vectors": vectors.identity(), "dim": vectors.dim,
                   "vocabulary": len(vocabulary), "found": words_found,
                   "coverage": words_found / max(1, len(vocabulary) - len(SPECIALS)),
                   "random": count}
