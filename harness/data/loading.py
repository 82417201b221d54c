"""Load GLUE tasks from local files (as their publishers ship them) or from the hub.

Every split becomes a :class:`datasets.Dataset` with the same columns whatever the source:
``text_a``, ``text_b`` (pair tasks only), ``label`` and ``idx``.  Local files are read
exactly as they are: the original GLUE TSVs, the STS Benchmark's headerless files, and
Hugging Face exports (split files named ``train`` / ``validation`` / ``test``, or
``validation_matched`` ... for MNLI, written by ``datasets`` as parquet, JSON lines, CSV or
TSV).  The layout of each file is recognised from its header (or, for the headerless CoLA
and STS Benchmark files, from its column count) using the small table of :class:`_Layout`
below, so a new variant is one more table row, not another branch.

Every file is checked against its task's schema before a row is returned: the number of
fields, the columns the layout reads (labels in the task's label set, STS-B scores finite
and within 0-5, the STS Benchmark's year and id columns, MRPC's ids, CoLA's source and
judgement marks, ``idx`` / ``index`` numbering the rows), non-empty texts, unique header
names, UTF-8, at least one row per split, and no training or dev file the same bytes as
a file in another task's folder (a folder filled from the wrong task).  A failure is a
:class:`DataFormatError` naming ``file:line`` (``file: row N`` for parquet), what is wrong
and what was expected; every problem of a file is listed, not only the first.

A run reads the training and dev splits only: a test split's gold labels are hidden, so
nothing in a run scores, trains on or labels it (``load_task(..., test_splits=False)``).
Its file still enters the task's fingerprint, byte for byte, but is not parsed, checked or
tokenised there; ``harness data check`` (:func:`check_tasks`) parses and checks the test
files too.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from harness.common.files import offline_variables
from harness.data.tasks import GLUE_TASKS, TaskSpec, get_task

HUB_DATASET = "nyu-mll/glue"
ENV_DATA_DIR = "HARNESS_DATA_DIR"
_HOW_TO_GET_DATA = (
    "pass --data-dir DIR, set the HARNESS_DATA_DIR environment variable, "
    "or run `harness data fetch --out DIR` on a machine online and point to DIR"
)
_UNLABELED = -1


class DataFormatError(ValueError):
    """Malformed data file; the message names the file and the 1-based line number (the
    row number for formats without lines, ``unit="row"``), then any further problems of
    the same file, one per line."""

    def __init__(self, path: str | Path, line: int | None, detail: str,
                 more: Sequence[tuple[int | None, str]] = (), unit: str = "line") -> None:
        self.path = Path(path)
        self.line = line
        self.detail = detail
        self.more = list(more)
        self.unit = unit
        super().__init__("\n".join(self._where(at, what)
                                   for at, what in [(line, detail), *self.more]))

    def _where(self, line: int | None, detail: str) -> str:
        if line is None:
            return f"{self.path}: {detail}"
        return f"{self.path}:{line}: {detail}" if self.unit == "line" else \
            f"{self.path}: row {line}: {detail}"

    def __reduce__(self) -> tuple[type, tuple]:
        return (type(self), (self.path, self.line, self.detail, self.more, self.unit))


class DataFormatErrors(DataFormatError):
    """Several malformed files of one task: each one's problems, file by file."""

    def __init__(self, errors: Sequence[DataFormatError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        self.path, self.line, self.detail = first.path, first.line, first.detail
        self.more, self.unit = first.more, first.unit
        ValueError.__init__(self, "\n".join(str(error) for error in self.errors))

    def __reduce__(self) -> tuple[type, tuple]:
        return (type(self), (self.errors,))


class DataNotFoundError(FileNotFoundError):
    """No data where it was looked for; the message says how to get some."""


@dataclass(frozen=True)
class TaskData:
    """All splits of one task, with where they came from."""

    task: TaskSpec
    splits: dict[str, datasets.Dataset]
    fingerprint: str
    """sha256 hex of every split's content (see :func:`load_task`) and the subsample spec."""
    source: str
    """Human-readable origin, e.g. ``local:/path/to/glue`` or ``hub:nyu-mll/glue``."""
    files: dict[str, str]
    """Split -> its file (the first shard of a parquet export), relative to the data
    folder, for every file the fingerprint hashes: test splits left out of ``splits``
    included (empty for the hub)."""
    layouts: dict[str, str] = field(default_factory=dict)
    """Split -> the file layout it was read as (``glue-cola``, ``sts-benchmark``, ...),
    for the splits in ``splits``."""


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class _Layout:
    """Where the text(s) and the label sit in one kind of file, and what the other columns
    it knows must hold.

    A layout with ``positional`` column names describes a headerless file; the others are
    recognised by their header, which must contain every ``text`` column (and the
    ``label`` column, except in unlabeled test files).
    """

    name: str
    text: tuple[str, ...]
    label: str
    positional: tuple[str, ...] = ()
    extra_fields: tuple[int, ...] = ()
    """Headerless only: how many fields beyond ``positional`` a row may carry (the STS
    Benchmark's two source tags, one per sentence)."""
    tasks: tuple[str, ...] = ()
    """The tasks whose files may have this layout; empty: any task with as many texts
    (header layouts only).  A header that is one task's own (MRPC's ids, QNLI's
    question) in another task's folder is that task's file, not this one's: QNLI's
    labels are RTE's, so it would load as RTE without a word."""
    checks: tuple[tuple[str, str], ...] = ()
    """(column, check) pairs for columns the loader does not return but which tell a
    shifted or swapped row apart: see ``_FIELD_CHECKS``."""
    requires: tuple[str, ...] = ()
    """Header layouts: further columns the header must hold (in a TSV) to be this layout."""
    key: tuple[str, ...] = ()
    """Columns that identify a row (every real file's rows differ in them): a row whose key
    an earlier row had is a repeat, which would be trained on or scored twice. Files with
    a row-number column catch repeats by the numbers instead."""


_INDEX_COLUMNS = ("idx", "index")
"""Row-number columns: integers; where the first row's is 0 they count the rows."""

_FIELD_CHECKS: dict[str, tuple[re.Pattern[str], str]] = {
    "integer": (re.compile(r"\d+"), "an integer id"),
    "year": (re.compile(r"\d{4}(test|train|dev)?"), "a year such as 2012 or 2012test"),
    "mark": (re.compile(r"[*?#]{0,2}"), "a judgement mark: empty, *, ?, ?? or *?"),
    "source": (re.compile(r"\S+"), "a source code such as gj04 (no spaces)"),
    "token": (re.compile(r"\S+"), "one word such as main-captions or MSRvid"),
}

_HEADER_LAYOUTS: tuple[_Layout, ...] = (
    _Layout("glue-mrpc", text=("#1 String", "#2 String"), label="Quality",
            checks=(("#1 ID", "integer"), ("#2 ID", "integer")), key=("#1 ID", "#2 ID"),
            tasks=("mrpc",)),
    _Layout("glue-qqp", text=("question1", "question2"), label="is_duplicate",
            checks=(("qid1", "integer"), ("qid2", "integer")), tasks=("qqp",)),
    _Layout("glue-mnli", text=("sentence1", "sentence2"), label="gold_label",
            tasks=("mnli",)),
    _Layout("glue-stsb", text=("sentence1", "sentence2"), label="score", tasks=("stsb",)),
    _Layout("glue-qnli", text=("question", "sentence"), label="label", tasks=("qnli",)),
    _Layout("glue-pair", text=("sentence1", "sentence2"), label="label"),  # RTE, WNLI
    _Layout("glue-single", text=("sentence",), label="label"),  # SST-2; CoLA/SST-2 test
)
"""Original GLUE TSVs; the task's own Hugging Face export layout is tried before these."""

_HEADERLESS_LAYOUTS: tuple[_Layout, ...] = (
    _Layout(
        "glue-cola",
        text=("sentence",),
        label="label",
        positional=("source", "label", "mark", "sentence"),
        tasks=("cola",),
        checks=(("source", "source"), ("mark", "mark")),
    ),
    _Layout(
        "cola-variant",
        text=("sentence",),
        label="label",
        positional=("sentence", "label"),
        tasks=("cola",),
    ),
    _Layout(
        "sts-benchmark",
        text=("sentence1", "sentence2"),
        label="score",
        positional=("genre", "file", "year", "id", "score", "sentence1", "sentence2"),
        extra_fields=(2,),
        tasks=("stsb",),
        checks=(("genre", "token"), ("file", "token"), ("year", "year"), ("id", "integer")),
        key=("genre", "file", "year", "id"),
    ),
)


def _hf_export_layout(spec: TaskSpec) -> _Layout:
    """A Hugging Face export: the hub's field names, ``label`` and ``idx``.  As a TSV it is
    written with CSV quoting (pandas': a field holding a quote is wrapped in quotes, the
    quotes inside doubled), unlike GLUE's own TSVs, whose quotes are literal; ``idx`` tells
    the two apart (GLUE's files have ``index`` or no row number)."""
    return _Layout("hf-export", text=spec.text_fields, label="label", requires=("idx",))


def _is_tsv_export(spec: TaskSpec, header: list[str]) -> bool:
    """Whether a TSV's first line is a Hugging Face export's header (read with quoting)."""
    layout = _hf_export_layout(spec)
    names = {name.strip() for name in header}
    return all(column in names for column in (*layout.text, *layout.requires))


_SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": ("train.tsv", "sts-train.csv"),
    "dev": ("dev.tsv", "sts-dev.csv"),
    "test": ("test.tsv", "sts-test.csv"),
}
"""The GLUE and STS Benchmark names of each split's file; other splits (MNLI) are read from
``<split>.tsv``.  Hugging Face exports are found by their split names (see
:func:`_split_candidates`)."""

_EXPORT_FORMATS = ("tsv", "csv", "jsonl", "json", "parquet")


@dataclass(frozen=True)
class _FileLayout:
    """A layout resolved against one file: column positions and expected width."""

    layout: _Layout
    text_cols: tuple[int, ...]
    label_col: int | None  # None: unlabeled (test files without a label column)
    n_fields: int
    has_header: bool
    checks: tuple[tuple[int, str, str], ...] = ()
    """(column position, column name, check) of the columns checked but not returned."""
    index_col: int | None = None
    key_cols: tuple[int, ...] = ()
    """Positions of the layout's ``key`` columns (all of them, or none)."""


def _match_layout(
    spec: TaskSpec, fields: list[str], path: Path, lineno: int, is_test: bool,
    named: bool = False
) -> _FileLayout:
    """Recognise a file's layout from its first record (split into fields); ``named``:
    the format names its columns (JSON lines, parquet), so the record is a header."""
    names = [f.strip() for f in fields]
    arity = len(spec.text_fields)
    candidates = [_hf_export_layout(spec)] + [
        lay for lay in _HEADER_LAYOUTS
        if len(lay.text) == arity and (not lay.tasks or spec.name in lay.tasks)
    ]
    with_text = [lay for lay in candidates if all(col in names for col in lay.text)
                 and (named or all(col in names for col in lay.requires))]
    if with_text or named:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise DataFormatError(path, lineno, f"header repeats column(s) {repeated} "
                                  "(expected unique column names)")
    for lay in with_text:
        label_col = names.index(lay.label) if lay.label in names else None
        if label_col is None and not is_test:
            continue
        return _header_layout(lay, names, label_col)
    if with_text:
        raise DataFormatError(
            path,
            lineno,
            f"header {names!r} has no label column (expected {with_text[0].label!r})",
        )
    for lay in () if named else _HEADERLESS_LAYOUTS:
        if spec.name not in lay.tasks:
            continue
        width = len(lay.positional)
        if len(fields) - width in (0, *lay.extra_fields):
            return _headerless_layout(lay)
    known = "; ".join(dict.fromkeys(" ".join((*lay.text, lay.label)) for lay in candidates))
    other = next((lay for lay in _HEADER_LAYOUTS if lay.tasks and spec.name not in lay.tasks
                  and all(col in names for col in (*lay.text, lay.label))), None)
    whose = (f" (it is the header of {'/'.join(other.tasks)}'s files, but the folder is "
             f"read as task {spec.name})" if other is not None else "")
    raise DataFormatError(
        path,
        lineno,
        f"unrecognised header {names!r} for task {spec.name}{whose}: "
        f"expected columns including one of: {known}",
    )


def _header_layout(lay: _Layout, names: list[str], label_col: int | None) -> _FileLayout:
    """``lay`` resolved against a header's column ``names``."""
    return _FileLayout(
        lay,
        tuple(names.index(c) for c in lay.text),
        label_col,
        len(names),
        has_header=True,
        checks=tuple((names.index(column), column, check) for column, check in lay.checks
                     if column in names),
        index_col=next((names.index(c) for c in _INDEX_COLUMNS if c in names), None),
        key_cols=(tuple(names.index(c) for c in lay.key)
                  if all(c in names for c in lay.key) else ()),
    )


def _headerless_layout(lay: _Layout) -> _FileLayout:
    """``lay`` for a file without a header: its columns in their fixed positions."""
    cols = lay.positional
    return _FileLayout(
        lay,
        tuple(cols.index(c) for c in lay.text),
        cols.index(lay.label),
        len(cols),
        has_header=False,
        checks=tuple((cols.index(column), column, check) for column, check in lay.checks),
        key_cols=tuple(cols.index(c) for c in lay.key),
    )


# --------------------------------------------------------------------------- values


def _clean_text(text: str) -> str:
    """One-line text: tabs and newlines become spaces, outer whitespace goes."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ").strip()


def _parse_label(spec: TaskSpec, raw: str, is_test: bool, path: Path, line: int,
                 names: Sequence[str] | None = None, unit: str = "line") -> int | float:
    """A label as the task counts it; ``names``: the file's own class names for its
    integer labels (a parquet export's ClassLabel), mapped to the task's by name."""
    value = raw.strip()
    if spec.is_regression:
        try:
            score = float(value)
        except ValueError:
            if is_test and value == "":
                return math.nan
            raise DataFormatError(path, line, f"score {raw!r} is not a number (expected a "
                                  "similarity score from 0 to 5)", unit=unit) from None
        if is_test and score == _UNLABELED:
            return math.nan
        if not math.isfinite(score):
            raise DataFormatError(path, line, f"score {raw!r} is not a finite number "
                                  "(expected a similarity score from 0 to 5)", unit=unit)
        if not 0 <= score <= 5:
            raise DataFormatError(path, line, f"score {raw!r} is outside 0-5 (expected a "
                                  "similarity score from 0 to 5)", unit=unit)
        return score
    if value in spec.label_names:
        return spec.label_names.index(value)
    try:
        number = int(value)
    except ValueError:
        number = None
    if names is not None and number is not None and 0 <= number < len(names) \
            and names[number] in spec.label_names:
        return spec.label_names.index(names[number])
    if names is None and number is not None and 0 <= number < spec.num_labels:
        return number
    if is_test and (value == "" or number == _UNLABELED):
        return _UNLABELED
    raise DataFormatError(
        path,
        line,
        f"label {raw!r} is not a label of {spec.name} (expected one of "
        f"{', '.join(spec.label_names)} or an integer in 0..{spec.num_labels - 1})",
        unit=unit,
    )


def _features(spec: TaskSpec) -> datasets.Features:
    cols = {"text_a": datasets.Value("string")}
    if spec.is_pair:
        cols["text_b"] = datasets.Value("string")
    cols["label"] = datasets.Value("float32" if spec.is_regression else "int64")
    cols["idx"] = datasets.Value("int64")
    return datasets.Features(cols)


def _build_dataset(
    spec: TaskSpec, texts: Sequence[Sequence[str]], labels: Sequence[int | float]
) -> datasets.Dataset:
    """Assemble a split from per-row texts and labels; ``idx`` is the row position."""
    columns: dict[str, list] = {"text_a": [row[0] for row in texts]}
    if spec.is_pair:
        columns["text_b"] = [row[1] for row in texts]
    columns["label"] = list(labels)
    columns["idx"] = list(range(len(labels)))
    return datasets.Dataset.from_dict(columns, features=_features(spec))


# --------------------------------------------------------------------------- local files


@dataclass
class _Table:
    """A split file as records of string fields, each with its line (or row) number: the
    first record is the header, or the first row of a headerless file."""

    records: list[tuple[int, list[str]]]
    named: bool = False
    """The format names its columns (JSON lines, parquet): the first record is a header."""
    unit: str = "line"
    label_names: tuple[str, ...] | None = None
    """The file's own names for its integer labels (a parquet export's ClassLabel)."""
    separator: str = "tab-separated "
    """How the format's fields are told apart, for messages."""
    quoted: bool = False
    """Read with CSV quoting (a TSV export: it enters the data's fingerprint)."""


_BOM = b"\xef\xbb\xbf"


def _decode(path: Path, raw: bytes) -> str:
    raw = raw.removeprefix(_BOM)  # error offsets count from after it
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataFormatError(path, line, f"byte 0x{raw[exc.start]:02x} at column {column} "
                              "is not UTF-8 (expected UTF-8 text)") from None


def _field_text(value: object) -> str:
    """A JSON or parquet value as the text a TSV would hold."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _read_table(spec: TaskSpec, path: Path, raw: bytes) -> _Table:
    """The file's records, parsed once by its format: a TSV whose header is a Hugging
    Face export's is read with its CSV quoting, GLUE's own TSVs literally."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path, raw)
    content = _decode(path, raw)
    if suffix in {".jsonl", ".json"}:
        return _read_json(path, content)
    first = _first_line(content)
    if _is_quoted_export(spec, path, first):
        return _read_csv(path, content, delimiter="\t")
    if suffix == ".csv" and first is not None and "\t" not in first:
        return _read_csv(path, content)
    # A blank line (spaces at most) is no row; one with tabs has fields, checked as any row.
    return _Table([(number, text.rstrip("\r").split("\t"))
                   for number, text in enumerate(content.split("\n"), start=1)
                   if text.strip(" \r")])


def _first_line(content: str) -> str | None:
    """The first line that is not blank (whitespace at most), without its line end."""
    return next((line.rstrip("\r") for line in content.split("\n") if line.strip()), None)


_UNQUOTED_SUFFIXES = frozenset({".parquet", ".jsonl", ".json"})


def _is_quoted_export(spec: TaskSpec, path: Path, first: str | None) -> bool:
    """Whether :func:`_read_table` reads a file whose first non-blank line is ``first``
    with CSV quoting, as a Hugging Face TSV export (JSON and parquet have no quoting)."""
    return path.suffix.lower() not in _UNQUOTED_SUFFIXES \
        and first is not None and _is_tsv_export(spec, first.split("\t"))


def _reads_quoted(spec: TaskSpec, path: Path, raw: bytes) -> bool:
    """:func:`_is_quoted_export` for a file that is hashed and not parsed, from its first
    non-blank line (a byte that is not UTF-8 is replaced: such a file would not load)."""
    if path.suffix.lower() in _UNQUOTED_SUFFIXES:
        return False
    return _is_quoted_export(spec, path, _first_line(
        raw.removeprefix(_BOM).decode("utf-8", errors="replace")))


def _read_csv(path: Path, content: str, delimiter: str = ",") -> _Table:
    """Fields separated by ``delimiter``, with CSV quoting, as ``datasets`` (pandas)
    writes CSV and TSV.

    Read strictly: a field that opens with a quote must be quoted whole (pandas writes
    ``"No,"" he said"`` for the text ``No," he said``).  The lenient reading would take
    ``"No," he said`` written literally as the text ``No, he said`` and load it without a
    word; strictly it is an error at its line."""
    reader = csv.reader(io.StringIO(content, newline=""), delimiter=delimiter, strict=True)
    records = []
    start = 1  # the first line of the next record (a quoted field may span several)
    try:
        for fields in reader:
            # A blank line (spaces at most) is no row; one of empty fields is a row.
            if len(fields) > 1 or (fields and fields[0].strip()):
                records.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as error:
        raise DataFormatError(path, start, f"not valid CSV ({error}) in the record that "
                              "starts here (expected a field that opens with a quote to be "
                              "quoted whole, its own quotes doubled)") from None
    return _Table(records, separator="comma-separated " if delimiter == "," else
                  "tab-separated ", quoted=delimiter == "\t")


def _read_json(path: Path, content: str) -> _Table:
    """JSON lines (what ``datasets`` writes), or one JSON array of objects."""
    if content.lstrip().startswith("["):
        try:
            items = json.loads(content)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, error.lineno, f"not valid JSON ({error.msg})") from None
        objects = list(enumerate(items, start=1))
        unit = "row"
    else:
        objects = []
        for number, text in enumerate(content.split("\n"), start=1):
            if text.strip():
                try:
                    objects.append((number, json.loads(text)))
                except json.JSONDecodeError as error:
                    raise DataFormatError(path, number, f"not valid JSON ({error.msg}; "
                                          "expected one object per line)") from None
        unit = "line"
    if not objects:
        return _Table([], named=True, unit=unit, separator="")
    for number, item in objects:
        if not isinstance(item, dict):
            raise DataFormatError(path, number, f"expected a JSON object, got "
                                  f"{type(item).__name__}", unit=unit)
    header = list(objects[0][1])
    records: list[tuple[int, list[str]]] = [(objects[0][0], header)]
    for number, item in objects:
        if set(item) != set(header):
            raise DataFormatError(path, number, f"keys {sorted(item)} differ from the first "
                                  f"row's {sorted(header)}", unit=unit)
        records.append((number, [_field_text(item[key]) for key in header]))
    return _Table(records, named=True, unit=unit, separator="")


def _read_parquet(path: Path, raw: bytes) -> _Table:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(raw))
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise DataFormatError(path, None, f"not a readable parquet file ({error})") from None
    header = list(table.column_names)
    records: list[tuple[int, list[str]]] = [(0, header)]
    columns = table.to_pydict()
    records += [(row + 1, [_field_text(columns[name][row]) for name in header])
                for row in range(table.num_rows)]
    return _Table(records, named=True, unit="row", label_names=_parquet_label_names(table),
                  separator="")


def _parquet_rows(raw: bytes) -> int | None:
    """A parquet file's row count from its footer; None when the footer is unreadable."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(io.BytesIO(raw)).num_rows
    except Exception:  # pyarrow raises several types for a damaged file
        return None


def _parquet_label_names(table) -> tuple[str, ...] | None:
    """The ClassLabel names ``datasets`` stores in a parquet file's metadata, if any."""
    metadata = (table.schema.metadata or {}).get(b"huggingface")
    if not metadata:
        return None
    try:
        features = json.loads(metadata)["info"]["features"]
    except (KeyError, TypeError, ValueError):
        return None
    label = features.get("label") if isinstance(features, dict) else None
    if isinstance(label, dict) and label.get("_type") == "ClassLabel" and label.get("names"):
        return tuple(str(name) for name in label["names"])
    return None


MAX_PROBLEMS = 20
"""Problems listed per file before the loader stops reading it."""


@dataclass
class _SplitRows:
    """One split file's rows, checked, and how it was read."""

    texts: list[tuple[str, ...]]
    labels: list[int | float]
    layout: str
    quoted: bool


def _read_split_file(spec: TaskSpec, path: Path, raw: bytes, is_test: bool,
                     first_row: int | None = 0) -> _SplitRows:
    """Parse one split file, checking every row against the task's schema.
    ``first_row``: the number of the file's first row (a later shard of a parquet export
    continues the count; None: unknown, as after an unreadable shard, so row numbers are
    not checked)."""
    table = _read_table(spec, path, raw)
    unit = table.unit
    if not table.records:
        raise DataFormatError(path, None, "file is empty (expected a header or rows)")
    if table.label_names is not None and not spec.is_regression \
            and sorted(table.label_names) != sorted(spec.label_names):
        raise DataFormatError(path, None, f"label names {list(table.label_names)} are not "
                              f"{spec.name}'s (expected {list(spec.label_names)})")
    first_line, first_fields = table.records[0]
    file_layout = _match_layout(spec, first_fields, path, first_line or None, is_test,
                                table.named)
    layout = file_layout.layout
    width = file_layout.n_fields
    widths = sorted({width + extra for extra in (0, *layout.extra_fields)})
    texts: list[tuple[str, ...]] = []
    labels: list[int | float] = []
    problems: list[tuple[int | None, str]] = []
    key_lines: dict[tuple[str, ...], int | None] = {}
    records = table.records[1:] if file_layout.has_header else table.records
    for lineno, fields in records:
        if len(problems) >= MAX_PROBLEMS:
            break
        if len(fields) not in widths:
            expected = " or ".join(map(str, widths))
            problems.append((lineno, f"expected {expected} {table.separator}fields, got "
                                     f"{len(fields)}"))
            continue
        row = None if first_row is None else first_row + len(texts) + len(problems)
        try:
            row_texts, label = _parse_row(spec, file_layout, table, path, (lineno, fields),
                                          row, is_test, key_lines)
        except DataFormatError as error:
            problems.append((error.line, error.detail))
            continue
        texts.append(row_texts)
        labels.append(label)
    if not problems and not texts:
        problems.append((None, "no data rows (expected at least one row"
                         + (" after the header)" if file_layout.has_header else ")")))
    if problems:
        (line, detail), *more = problems
        raise DataFormatError(path, line, detail, more, unit=unit)
    return _SplitRows(texts, labels, layout.name, table.quoted)


def _parse_row(spec: TaskSpec, file_layout: _FileLayout, table: _Table, path: Path,
               record: tuple[int, list[str]], row: int | None, is_test: bool,
               key_lines: dict[tuple[str, ...], int | None]
               ) -> tuple[tuple[str, ...], int | float]:
    """One record's texts and label, checked against the file's layout: texts present,
    checked columns well formed, the index column equal to ``row`` (None: not checked), the
    label valid, the key not seen before in the file (``key_lines``, which it extends)."""
    lineno, fields = record
    layout, unit = file_layout.layout, table.unit
    row_texts = tuple(_clean_text(fields[i]) for i in file_layout.text_cols)
    for name, text in zip(layout.text, row_texts, strict=True):
        if not text:
            raise DataFormatError(path, lineno, f"{name} is empty (expected text)", unit=unit)
    for position, column, check in file_layout.checks:
        pattern, expected = _FIELD_CHECKS[check]
        if not pattern.fullmatch(fields[position].strip()):
            raise DataFormatError(path, lineno, f"{column} {fields[position]!r} is not "
                                  f"{expected}", unit=unit)
    if file_layout.index_col is not None and row is not None:
        _check_index(fields[file_layout.index_col], row, path, lineno, unit)
    if file_layout.label_col is None:
        label: int | float = math.nan if spec.is_regression else _UNLABELED
    else:
        label = _parse_label(spec, fields[file_layout.label_col], is_test, path, lineno,
                             table.label_names, unit)
    if file_layout.key_cols:
        key = tuple(fields[i].strip() for i in file_layout.key_cols)
        if key in key_lines:
            raise DataFormatError(
                path, lineno, f"repeats the row {' / '.join(key)} "
                f"({', '.join(layout.key)}) of {unit} {key_lines[key]}", unit=unit)
        key_lines[key] = lineno
    return row_texts, label


READ_AS_QUOTED_TSV = "hf-export-tsv-quoted"
"""Enters the fingerprint of a split whose TSV was read with CSV quoting."""

COPIED_DEV_MIN_ROWS = 10
"""A dev split is refused as a copy of the training split when at least this many of its
rows, and at least half of them, are training rows (the same texts and label).  GLUE's own
dev splits share at most 6 rows with their training split (CoLA 6 of 527, STS-B 6 of
1,500; SST-2, MRPC and RTE none), so the rule cannot refuse a real split, while a dev file
cut from the training file (scoring students on what they trained on) cannot pass it."""


def _copied_dev_problem(train: set[tuple[tuple[str, ...], int | float]],
                        texts: Sequence[tuple[str, ...]], labels: Sequence[int | float],
                        train_file: Path) -> str | None:
    """Why a dev split's rows are the training split's (None: they are not)."""
    shared = sum((text, label) in train for text, label in zip(texts, labels, strict=True))
    if shared < COPIED_DEV_MIN_ROWS or 2 * shared < len(labels):
        return None
    return (f"{shared} of its {len(labels)} rows are rows of {train_file} too (the same "
            "texts and label): a dev split copied from the training split would score "
            "students on examples they trained on; use the task's own dev file")


BINARY_SCORES_MIN_ROWS = 20
"""A regression split is refused as another task's export when at least this many of its
rows are scored and every score is 0 or 1.  STS-B's scores run from 0 to 5 (its training
split: 5,749 rows, 140 distinct scores, 10% of them 0 or 1)."""


def _binary_scores_problem(spec: TaskSpec, labels: Sequence[int | float]) -> str | None:
    """Why a regression split's scores are a two-class task's labels (None: they are not).
    RTE's, MRPC's or QNLI's Hugging Face export has STS-B's columns (two sentences, a
    label), and its labels are valid scores: it would train and score as STS-B."""
    scored = [label for label in labels if not math.isnan(label)]
    if not spec.is_regression or len(scored) < BINARY_SCORES_MIN_ROWS \
            or not set(scored) <= {0.0, 1.0}:
        return None
    name = spec.display_name
    return (f"all {len(scored)} of its scores are 0 or 1, as a two-class task's labels are; "
            f"{name}'s similarity scores run from 0 to 5: is this another task's export "
            f"(RTE's, MRPC's and QNLI's have the same columns)? Use {name}'s own file")


def single_class_problem(spec: TaskSpec, labels: Iterable[float]) -> str | None:
    """Why a training split teaches nothing (None: it does): every row of a classification
    task in one class, or every score of a regression task equal.  A model trained on it
    predicts that class (or score) whatever its input, so it scores the dev split's
    majority-class (mean) baseline, and a teacher trained on it fails
    ``teacher.min_margin``.  Unlabelled rows are left out."""
    values = [float(label) for label in labels
              if not math.isnan(float(label)) and label != _UNLABELED]
    if not values or len(set(values)) > 1:
        return None
    if spec.is_regression:
        return f"all {len(values)} of its scores are {_format_label(spec, values[0])}"
    label = int(values[0])
    name = spec.label_names[label] if 0 <= label < len(spec.label_names) else "?"
    return (f"all {len(values)} of its labels are class {label} ({name}) of the task's "
            f"{len(spec.label_names)}: a model trained on it predicts that class whatever "
            "its input")


def _other_task_copy_problem(spec: TaskSpec, data_dir: Path, path: Path,
                             raw: bytes) -> str | None:
    """Why a training or dev file is a file of another task's folder in the same data
    folder, byte for byte (None: it is not).  SST-2's files read as CoLA's (the lowercased
    variant's layout is SST-2's: a sentence and a 0/1 label), and RTE's and WNLI's layouts
    are one: a folder filled from the wrong task passes every format check and trains and
    scores as the task it sits in.  Which of the two folders is wrong is not for the
    loader to guess, so both tasks are refused until one holds its own file."""
    for other in GLUE_TASKS.values():
        folder = data_dir / other.folder
        if other.name == spec.name or not folder.is_dir():
            continue
        for candidate in sorted(folder.iterdir()):
            if candidate.is_file() and candidate.stat().st_size == len(raw) \
                    and candidate.read_bytes() == raw:
                return (f"it is {candidate} byte for byte, a file of {other.display_name}'s "
                        f"folder: one of the two tasks holds the other's file, which would "
                        f"train and score as the task whose folder it is in without a "
                        f"word; put each task's own files in its folder")
    return None


def _check_index(raw: str, position: int, path: Path, line: int, unit: str) -> None:
    """An ``idx`` / ``index`` field numbers the rows from 0 (GLUE's files and their
    exports): a row whose number is not its position was moved, or a field swapped."""
    value = raw.strip()
    if value != str(position):
        raise DataFormatError(path, line, f"row number {raw!r} is not this row's "
                              f"(expected {position}: the rows are numbered from 0)", unit=unit)


def _split_candidates(spec: TaskSpec, split: str) -> list[str]:
    """File names a split may have: GLUE's and the STS Benchmark's, then a Hugging Face
    export's (``validation``, ``validation_matched``... in each format ``datasets``
    writes)."""
    hub_name = dict(spec.hub_splits).get(split, split)
    names = list(_SPLIT_FILES.get(split, (f"{split}.tsv",)))
    for stem in dict.fromkeys((split, hub_name)):
        names += [f"{stem}.{ext}" for ext in _EXPORT_FORMATS]
    return list(dict.fromkeys(names))


def _find_split_files(folder: Path, spec: TaskSpec, split: str) -> list[Path]:
    """The file(s) holding ``split``: one file, or the shards of a parquet export
    (``validation-00000-of-00002.parquet`` ...).  Two candidates for one split are an
    error: which one the user meant is not for the loader to guess."""
    found = [folder / name for name in _split_candidates(spec, split)
             if (folder / name).is_file()]
    hub_name = dict(spec.hub_splits).get(split, split)
    shards = sorted(folder.glob(f"{hub_name}-*-of-*.parquet"))
    groups = [[path] for path in found] + ([shards] if shards else [])
    if len(groups) > 1:
        names = ", ".join(group[0].name + (" ..." if len(group) > 1 else "")
                          for group in groups)
        raise DataFormatError(folder, None, f"several files for the {split} split ({names});"
                              " keep one")
    return groups[0] if groups else []


def _quoting_mark(quoted: bool) -> bytes:
    """What a split's entry in the fingerprint adds to the digest of its bytes where they
    are read with CSV quoting: the same bytes read literally are other rows, so they never
    share a fingerprint (nor the cache entries and run ids that follow it)."""
    return f"\0{READ_AS_QUOTED_TSV}".encode() if quoted else b""


def _load_local(
    spec: TaskSpec, data_dir: Path, test_splits: bool = True
) -> tuple[dict[str, datasets.Dataset], dict[str, str], dict[str, str], bytes]:
    """Read every split file of a task; returns (splits, files relative to ``data_dir``,
    layouts, content digest input).  ``test_splits=False``: a test split's file is hashed
    for the digest as it is when read, and neither parsed nor checked."""
    folder = data_dir / spec.folder
    if not folder.is_dir():
        raise DataNotFoundError(
            f"no folder {spec.folder!r} for task {spec.name} in {data_dir}; {_HOW_TO_GET_DATA}"
        )
    splits: dict[str, datasets.Dataset] = {}
    files: dict[str, str] = {}
    layouts: dict[str, str] = {}
    digests: dict[str, bytes] = {}
    failures: list[DataFormatError] = []  # every malformed file is reported, not the first
    train_rows: set[tuple[tuple[str, ...], int | float]] = set()
    for split in ("train", *spec.dev_splits, *spec.test_splits):
        paths = _find_split_files(folder, spec, split)
        if not paths:
            if split in spec.test_splits:
                continue
            if failures:  # what is wrong with the files that are there comes first
                break
            wanted = " or ".join(_split_candidates(spec, split)[:4])
            raise DataNotFoundError(
                f"no {split} file for task {spec.name} in {folder} (looked for {wanted}, "
                f"and the other formats of a Hugging Face export); {_HOW_TO_GET_DATA}"
            )
        if split in spec.test_splits and not test_splits:
            digests[split] = _unparsed_digest(spec, paths)
            files[split] = paths[0].relative_to(data_dir).as_posix()
            continue
        read = _read_shards(spec, paths, split in spec.test_splits, failures)
        if read is None:
            continue
        train_file = data_dir / files["train"] if "train" in splits else None
        if problems := _split_problems(spec, split, data_dir, read, train_rows, train_file):
            failures += problems
            continue
        if split == "train":
            train_rows = set(zip(read.texts, read.labels, strict=True))
        splits[split] = _build_dataset(spec, read.texts, read.labels)
        layouts[split] = read.parts[0].layout
        files[split] = paths[0].relative_to(data_dir).as_posix()
        digests[split] = read.digest + _quoting_mark(read.parts[0].quoted)
    if failures:
        raise failures[0] if len(failures) == 1 else DataFormatErrors(failures)
    digest_input = b"".join(split.encode() + b"\0" + digests[split]
                            for split in sorted(digests))
    return splits, files, layouts, digest_input


def _unparsed_digest(spec: TaskSpec, paths: list[Path]) -> bytes:
    """A split's entry in the digest from its files' bytes alone (a test split that is not
    parsed), marked as the file would be read."""
    first = paths[0].read_bytes()
    digest = hashlib.sha256(first)
    for path in paths[1:]:
        digest.update(path.read_bytes())
    return digest.digest() + _quoting_mark(_reads_quoted(spec, paths[0], first))


@dataclass
class _ReadSplit:
    """A split's files, every one parsed: their bytes, rows and the digest of the bytes."""

    paths: list[Path]
    raws: list[bytes]
    parts: list[_SplitRows]
    texts: list[tuple[str, ...]] = field(default_factory=list)
    labels: list[int | float] = field(default_factory=list)
    digest: bytes = b""


def _read_shards(spec: TaskSpec, paths: list[Path], is_test: bool,
                 failures: list[DataFormatError]) -> _ReadSplit | None:
    """Parse a split's files (one, or a parquet export's shards, rows numbered across them);
    None, with each malformed file's error added to ``failures``, when any is malformed."""
    digest = hashlib.sha256()
    read = _ReadSplit(paths=paths, raws=[], parts=[])
    first_row: int | None = 0  # the next shard's first row number (None: unknown)
    for path in paths:
        raw = path.read_bytes()
        read.raws.append(raw)
        digest.update(raw)
        try:
            part = _read_split_file(spec, path, raw, is_test=is_test, first_row=first_row)
        except DataFormatError as error:
            failures.append(error)
            # The next shard's rows continue this one's count, malformed or not.
            rows = _parquet_rows(raw) if path.suffix.lower() == ".parquet" else None
            first_row = None if first_row is None or rows is None else first_row + rows
            continue
        read.parts.append(part)
        read.texts += part.texts
        read.labels += part.labels
        first_row = None if first_row is None else first_row + len(part.labels)
    if len(read.parts) < len(paths):
        return None
    read.digest = digest.digest()
    return read


def _split_problems(spec: TaskSpec, split: str, data_dir: Path, read: _ReadSplit,
                    train_rows: set[tuple[tuple[str, ...], int | float]],
                    train_file: Path | None) -> list[DataFormatError]:
    """What is wrong with a parsed split as a whole: a copy of another task's file, binary
    scores where the task scores on a scale, a dev split copied from the training split
    (``train_file``, when the training split was read)."""
    if split in spec.test_splits:
        return []
    copies = [DataFormatError(path, None, problem)
              for path, raw in zip(read.paths, read.raws, strict=True)
              if (problem := _other_task_copy_problem(spec, data_dir, path, raw)) is not None]
    if copies:
        return copies
    if (problem := _binary_scores_problem(spec, read.labels)) is not None:
        return [DataFormatError(read.paths[0], None, problem)]
    if split in spec.dev_splits and train_file is not None:
        problem = _copied_dev_problem(train_rows, read.texts, read.labels, train_file)
        if problem is not None:
            return [DataFormatError(read.paths[0], None, problem)]
    return []


# --------------------------------------------------------------------------- hub


def _convert_hub_split(spec: TaskSpec, ds: datasets.Dataset, is_test: bool) -> datasets.Dataset:
    columns = ds.select_columns([*spec.text_fields, "label"]).to_dict()
    texts = list(zip(*(map(_clean_text, columns[f]) for f in spec.text_fields), strict=True))
    labels: list[int | float] = []
    for label in columns["label"]:
        if spec.is_regression:
            labels.append(math.nan if is_test and label == _UNLABELED else float(label))
        else:
            if not (0 <= label < spec.num_labels or (is_test and label == _UNLABELED)):
                raise ValueError(f"hub {spec.hub_config}: label {label} out of range")
            labels.append(int(label))
    return _build_dataset(spec, texts, labels)


def load_hub_dataset(path: str, name: str | None, split: str | None = None,
                     local_hint: str = "") -> Any:
    """``datasets.load_dataset``, with a hub that cannot be reached (offline, or a dataset
    not in the local cache) turned into a :class:`DataNotFoundError` that says what to do."""
    try:
        return datasets.load_dataset(path, name, **({"split": split} if split else {}))
    except (ConnectionError, FileNotFoundError) as error:  # DatasetNotFoundError is one
        detail = (str(error).strip().splitlines() or [""])[0]
        offline = offline_variables()
        where = f"{path}/{name}" if name else path
        if offline or isinstance(error, ConnectionError):
            why = (f" ({' and '.join(offline)} {'is' if len(offline) == 1 else 'are'} set)"
                   if offline else "")
            raise DataNotFoundError(
                f"hub dataset {where} cannot be loaded{why} and is not in the local datasets "
                f"cache ({type(error).__name__}: {detail}): run once where the hub is "
                f"reachable (it is then cached){local_hint}") from error
        raise DataNotFoundError(
            f"hub dataset {where} cannot be loaded ({type(error).__name__}: {detail}): check "
            f"its name and configuration, and your access to it (hf auth login){local_hint}"
        ) from error


def _load_hub(spec: TaskSpec, test_splits: bool = True
              ) -> tuple[dict[str, datasets.Dataset], bytes]:
    loaded = load_hub_dataset(
        HUB_DATASET, spec.hub_config,
        local_hint=(", or read a local GLUE folder with --data-dir DIR (it sets "
                    "data.source=local; `harness data fetch --out DIR` on a machine online "
                    "writes one)"))
    splits: dict[str, datasets.Dataset] = {}
    fingerprints: dict[str, str] = {}
    for split, hub_split in spec.hub_splits:
        if hub_split not in loaded:
            if split in spec.test_splits:
                continue
            raise DataNotFoundError(f"hub {HUB_DATASET}/{spec.hub_config} has no {hub_split!r}")
        hub_ds = loaded[hub_split]
        fingerprints[split] = hub_ds._fingerprint
        if split in spec.test_splits and not test_splits:
            continue
        splits[split] = _convert_hub_split(spec, hub_ds, is_test=split in spec.test_splits)
    digest_input = b"".join(
        f"{split}\0{fingerprints[split]}\0".encode() for split in sorted(fingerprints)
    )
    return splits, digest_input


# --------------------------------------------------------------------------- public API


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """Find the GLUE data folder: ``explicit`` > ``$HARNESS_DATA_DIR`` > the shared default.

    The default is ``shared/data/glue`` beside the repository (``../shared/data/glue``
    from its root).  A folder named explicitly (argument or environment) must exist: it
    is an error, not a reason to fall back silently to another folder.
    """
    for chosen, how in ((explicit, "--data-dir or the suite's data.dir"),
                        (os.environ.get(ENV_DATA_DIR), ENV_DATA_DIR)):
        if chosen:
            path = Path(chosen).expanduser()
            if not path.is_dir():
                raise DataNotFoundError(
                    f"data directory {path} (from {how}) does not exist; {_HOW_TO_GET_DATA}"
                )
            return path
    default = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"
    if default.is_dir():
        return default
    raise DataNotFoundError(
        f"no GLUE data directory found (default {default} does not exist); {_HOW_TO_GET_DATA}"
    )


def _subsample(
    ds: datasets.Dataset, max_examples: int | None, seed: int
) -> tuple[datasets.Dataset, str]:
    """Keep a deterministic random ``max_examples`` rows, in file order; returns the spec."""
    if max_examples is not None and max_examples < 1:  # a split is never empty
        raise ValueError(f"max_train_examples must be >= 1, got {max_examples}")
    if max_examples is None or max_examples >= len(ds):
        return ds, "subsample=none"
    keep = np.sort(np.random.default_rng(seed).permutation(len(ds))[:max_examples])
    with _no_progress_bars():  # under a second of copying, on every plan of the task
        flat = ds.select(keep.tolist()).flatten_indices()
    return flat, f"subsample={max_examples},seed={seed}"


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """The datasets library's progress bars off inside the block, back on after it where
    they were on."""
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def load_task(
    task: str | TaskSpec,
    source: str = "local",
    data_dir: str | Path | None = None,
    max_train_examples: int | None = None,
    subsample_seed: int = 0,
    test_splits: bool = True,
) -> TaskData:
    """Load every split of ``task`` from a GLUE-style folder or from the hub.

    ``max_train_examples`` subsamples the train split only (``idx`` keeps the original
    row numbers).  The fingerprint hashes the bytes of every split's file(s) (hub: the
    datasets' fingerprints), the source kind and the subsample spec; it does not hash
    the folder's location, so the same files give the same fingerprint wherever they
    are mounted.

    ``test_splits=False`` (what a run loads: nothing in it reads a test split, whose gold
    labels are hidden) leaves the test splits out of ``splits`` and ``layouts``: their
    files are hashed into the same fingerprint, and named in ``files``, but not parsed,
    so a malformed one goes unnoticed until something loads it with ``test_splits=True``
    (the default; ``harness data check``).
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    if source == "local":
        root = resolve_data_dir(data_dir)
        splits, files, layouts, digest_input = _load_local(spec, root, test_splits)
        source_name = f"local:{root}"
    elif source == "hub":
        splits, digest_input = _load_hub(spec, test_splits)
        files, layouts = {}, {}
        source_name = f"hub:{HUB_DATASET}"
    else:
        raise ValueError(f"unknown data source {source!r}; expected 'local' or 'hub'")
    splits["train"], subsample_spec = _subsample(
        splits["train"], max_train_examples, subsample_seed
    )
    digest = hashlib.sha256(digest_input)
    digest.update(f"source={source}\0task={spec.name}\0{subsample_spec}".encode())
    return TaskData(
        task=spec,
        splits=splits,
        fingerprint=digest.hexdigest(),
        source=source_name,
        files=files,
        layouts=layouts,
    )


@dataclass
class TaskCheck:
    """What ``harness data check`` reports for one task: rows per split, or the errors."""

    task: str
    rows: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    layouts: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What loads but would not train: a training file of a single class
    (:func:`single_class_problem`)."""


def check_tasks(tasks: Iterable[str] | None, data_dir: str | Path | None = None
                ) -> tuple[Path, list[TaskCheck]]:
    """Load and validate every split of ``tasks`` (default: every task with a folder in
    the data directory) the way a run reads them, test splits included, which a run
    only hashes."""
    root = resolve_data_dir(data_dir)
    specs = ([get_task(name) for name in tasks] if tasks else
             [spec for spec in GLUE_TASKS.values() if (root / spec.folder).is_dir()])
    if not specs:
        raise DataNotFoundError(f"no GLUE task folder in {root}; {_HOW_TO_GET_DATA}")
    checks = []
    for spec in specs:
        check = TaskCheck(spec.name)
        try:
            loaded = load_task(spec, data_dir=root, test_splits=True)
        except (DataFormatError, DataNotFoundError) as error:
            check.errors = str(error).splitlines()
        else:
            check.rows = {split: len(rows) for split, rows in loaded.splits.items()}
            check.files, check.layouts = loaded.files, loaded.layouts
            problem = single_class_problem(spec, loaded.splits["train"]["label"])
            if problem is not None:
                check.warnings.append(f"{root / loaded.files.get('train', 'train')}: {problem}")
        checks.append(check)
    return root, checks


def _format_label(spec: TaskSpec, label: float) -> str:
    if spec.is_regression:
        # Shortest text that reads back as the same float32 (3.8, not 3.799999952).
        return np.format_float_positional(np.float32(label), trim="-")
    return str(int(label))


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch_glue(
    tasks: Iterable[str],
    out_dir: str | Path,
    load_fn: Callable = datasets.load_dataset,
) -> list[Path]:
    """Download GLUE tasks and write them as ``out_dir/<folder>/<split>.tsv``.

    The files use the "HF export" layout (the task's text fields, ``label``, ``idx``;
    tab separated with CSV quoting, as ``datasets`` writes a TSV; tabs and newlines in
    text turned into spaces), which :func:`load_task` reads back with ``source="local"``.
    """
    written: list[Path] = []
    for name in tasks:
        spec = get_task(name)
        loaded = load_fn(HUB_DATASET, spec.hub_config)
        for split, hub_split in spec.hub_splits:
            if hub_split not in loaded:
                continue
            ds = loaded[hub_split]
            columns = ds.select_columns([*spec.text_fields, "label"]).to_dict()
            buffer = io.StringIO()
            writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
            writer.writerow((*spec.text_fields, "label", "idx"))
            for i in range(len(ds)):
                texts = [_clean_text(columns[f][i]) for f in spec.text_fields]
                writer.writerow((*texts, _format_label(spec, columns["label"][i]), str(i)))
            path = Path(out_dir) / spec.folder / f"{split}.tsv"
            _write_atomic(path, buffer.getvalue())
            written.append(path)
    return written
