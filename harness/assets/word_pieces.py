"""How a tokenizer marks where a word begins in its pieces, for code that works on whole
words (word-level augmentation, word candidates of a masked-LM head).

Three conventions cover the supported architectures:

- WordPiece (BERT, ELECTRA, DistilBERT): a piece that continues a word carries a prefix
  (``##ing``); every other piece starts a word.
- Byte-level BPE (RoBERTa): a piece that follows a space carries ``Ġ`` (the byte-level
  alphabet's space); the first word of a text and pieces after punctuation carry none.
- SentencePiece (DeBERTa-v2/v3's Metaspace pre-tokenizer): a piece that starts a
  whitespace-separated word carries ``▁``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PieceConvention:
    """``kind``: "continuation" (a prefix marks a piece that continues a word) or
    "word_start" (a prefix marks a piece that starts a word after a space); ``marker``:
    that prefix."""

    kind: Literal["continuation", "word_start"]
    marker: str

    def starts_word(self, token: str) -> bool:
        """Whether a vocabulary piece begins a word written after a space (what may stand
        for a whole word in a candidate list)."""
        if self.kind == "continuation":
            return not token.startswith(self.marker)
        return token.startswith(self.marker) and len(token) > len(self.marker)


def _pre_tokenizer_types(node: object) -> list[dict]:
    if not isinstance(node, dict):
        return []
    found = [node]
    for child in node.get("pretokenizers") or []:
        found.extend(_pre_tokenizer_types(child))
    return found


def piece_convention(tokenizer: PreTrainedTokenizerBase) -> PieceConvention:
    """The tokenizer's word-start convention, read from its fast backend (a slow WordPiece
    tokenizer is recognised by its ``wordpiece_tokenizer``).  Raises TypeError for a
    tokenizer that follows none of the three."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if model.get("type") == "WordPiece":
            return PieceConvention("continuation", model.get("continuing_subword_prefix") or "##")
        for pre in _pre_tokenizer_types(spec.get("pre_tokenizer")):
            if pre.get("type") == "ByteLevel":
                return PieceConvention("word_start", "\u0120")
            if pre.get("type") == "Metaspace":
                return PieceConvention("word_start", pre.get("replacement") or "\u2581")
    elif getattr(tokenizer, "wordpiece_tokenizer", None) is not None:
        return PieceConvention("continuation", "##")
    raise TypeError(f"{type(tokenizer).__name__}: neither WordPiece, byte-level BPE nor a "
                    "SentencePiece (Metaspace) fast tokenizer; its word boundaries are unknown")
