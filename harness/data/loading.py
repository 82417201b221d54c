"""Load GLUE tasks from local files (as their publishers ship them) or from the hub.

Every split becomes a :class:`datasets.Dataset` with the same columns whatever the source:
``text_a``, ``text_b`` (pair tasks only), ``label`` and ``idx``.  Local files are read
exactly as they are: the layout of each file is recognised from its header (or, for the
headerless CoLA and STS Benchmark files, from its column count) using the small table of
:class:`_Layout` below, so a new variant is one more table row, not another branch.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from harness.data.tasks import TaskSpec, get_task

HUB_DATASET = "nyu-mll/glue"
ENV_DATA_DIR = "HARNESS_DATA_DIR"
_HOW_TO_GET_DATA = (
    "pass --data-dir DIR, set the HARNESS_DATA_DIR environment variable, "
    "or run `harness data fetch --out DIR` on a machine online and point to DIR"
)
_UNLABELED = -1


class DataFormatError(ValueError):
    """Malformed data file; the message names the file and the 1-based line number."""

    def __init__(self, path: str | Path, line: int | None, detail: str) -> None:
        self.path = Path(path)
        self.line = line
        self.detail = detail
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[type, tuple[Path, int | None, str]]:
        return (type(self), (self.path, self.line, self.detail))


class DataNotFoundError(FileNotFoundError):
    """No data where it was looked for; the message says how to get some."""


@dataclass(frozen=True)
class TaskData:
    """All splits of one task, with where they came from."""

    task: TaskSpec
    splits: dict[str, datasets.Dataset]
    fingerprint: str
    """sha256 hex of the content read (see :func:`load_task`) and the subsample spec."""
    source: str
    """Human-readable origin, e.g. ``local:/path/to/glue`` or ``hub:nyu-mll/glue``."""
    files: dict[str, str]
    """Split -> file read, relative to the data folder (empty for the hub)."""
    layouts: dict[str, str] = field(default_factory=dict)
    """Split -> the file layout it was read as (``glue-cola``, ``sts-benchmark``, ...)."""


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class _Layout:
    """Where the text(s) and the label sit in one kind of file.

    A layout with ``positional`` column names describes a headerless file; the others are
    recognised by their header, which must contain every ``text`` column (and the
    ``label`` column, except in unlabeled test files).
    """

    name: str
    text: tuple[str, ...]
    label: str
    positional: tuple[str, ...] = ()
    allow_extra: bool = False
    """Headerless only: ignore columns beyond ``positional`` (STS Benchmark source tags)."""
    tasks: tuple[str, ...] = ()
    """Headerless only: the tasks whose files may have this layout."""


_HEADER_LAYOUTS: tuple[_Layout, ...] = (
    _Layout("glue-mrpc", text=("#1 String", "#2 String"), label="Quality"),
    _Layout("glue-qqp", text=("question1", "question2"), label="is_duplicate"),
    _Layout("glue-mnli", text=("sentence1", "sentence2"), label="gold_label"),
    _Layout("glue-stsb", text=("sentence1", "sentence2"), label="score"),
    _Layout("glue-qnli", text=("question", "sentence"), label="label"),
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
        allow_extra=True,
        tasks=("stsb",),
    ),
)


def _hf_export_layout(spec: TaskSpec) -> _Layout:
    return _Layout("hf-export", text=spec.text_fields, label="label")


_SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": ("train.tsv", "sts-train.csv"),
    "dev": ("dev.tsv", "sts-dev.csv"),
    "test": ("test.tsv", "sts-test.csv"),
}
"""Candidate file names per split; other splits (MNLI) are read from ``<split>.tsv``."""


@dataclass(frozen=True)
class _FileLayout:
    """A layout resolved against one file: column positions and expected width."""

    layout: _Layout
    text_cols: tuple[int, ...]
    label_col: int | None  # None: unlabeled (test files without a label column)
    n_fields: int
    has_header: bool


def _match_layout(
    spec: TaskSpec, fields: list[str], path: Path, lineno: int, is_test: bool
) -> _FileLayout:
    """Recognise a file's layout from its first non-blank line (split into fields)."""
    names = [f.strip() for f in fields]
    arity = len(spec.text_fields)
    candidates = [_hf_export_layout(spec)] + [
        lay for lay in _HEADER_LAYOUTS if len(lay.text) == arity
    ]
    with_text = [lay for lay in candidates if all(col in names for col in lay.text)]
    for lay in with_text:
        if lay.label in names:
            return _FileLayout(
                lay,
                tuple(names.index(c) for c in lay.text),
                names.index(lay.label),
                len(names),
                has_header=True,
            )
    if with_text:
        if not is_test:
            raise DataFormatError(
                path,
                lineno,
                f"header {names!r} has no label column (expected {with_text[0].label!r})",
            )
        lay = with_text[0]
        return _FileLayout(
            lay, tuple(names.index(c) for c in lay.text), None, len(names), has_header=True
        )
    for lay in _HEADERLESS_LAYOUTS:
        if spec.name not in lay.tasks:
            continue
        width = len(lay.positional)
        if len(fields) == width or (lay.allow_extra and len(fields) > width):
            cols = lay.positional
            return _FileLayout(
                lay,
                tuple(cols.index(c) for c in lay.text),
                cols.index(lay.label),
                width,
                has_header=False,
            )
    known = "; ".join(" ".join((*lay.text, lay.label)) for lay in candidates)
    raise DataFormatError(
        path,
        lineno,
        f"unrecognised header {names!r} for task {spec.name}: "
        f"expected columns including one of: {known}",
    )


# --------------------------------------------------------------------------- values


def _clean_text(text: str) -> str:
    """One-line text: tabs and newlines become spaces, outer whitespace goes."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ").strip()


def _parse_label(spec: TaskSpec, raw: str, is_test: bool, path: Path, line: int) -> int | float:
    value = raw.strip()
    if spec.is_regression:
        try:
            score = float(value)
        except ValueError:
            if is_test and value == "":
                return math.nan
            raise DataFormatError(path, line, f"score {raw!r} is not a number") from None
        if not math.isfinite(score):
            raise DataFormatError(path, line, f"score {raw!r} is not a finite number")
        if is_test and score == _UNLABELED:
            return math.nan
        return score
    if value in spec.label_names:
        return spec.label_names.index(value)
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is not None and 0 <= number < spec.num_labels:
        return number
    if is_test and (value == "" or number == _UNLABELED):
        return _UNLABELED
    names = ", ".join(spec.label_names)
    raise DataFormatError(
        path,
        line,
        f"label {raw!r} is neither one of {names} nor an integer in 0..{spec.num_labels - 1}",
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


def _read_split_file(spec: TaskSpec, path: Path, raw: bytes, is_test: bool
                     ) -> tuple[datasets.Dataset, str]:
    """Parse one TSV (quoting off, BOM stripped) into a split Dataset; also returns the
    name of the layout the file was read as."""
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataFormatError(path, None, f"not valid UTF-8 ({exc})") from None
    lines = content.split("\n")
    first = next((i for i, text in enumerate(lines) if text.strip()), None)
    if first is None:
        raise DataFormatError(path, None, "file is empty")
    file_layout = _match_layout(
        spec, lines[first].rstrip("\r").split("\t"), path, first + 1, is_test
    )
    width = file_layout.n_fields
    texts: list[tuple[str, ...]] = []
    labels: list[int | float] = []
    start = first + 1 if file_layout.has_header else first
    for lineno, text in enumerate(lines[start:], start=start + 1):
        text = text.rstrip("\r")
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) < width or (len(fields) > width and not file_layout.layout.allow_extra):
            at_least = "at least " if file_layout.layout.allow_extra else ""
            raise DataFormatError(
                path,
                lineno,
                f"expected {at_least}{width} tab-separated fields, got {len(fields)}",
            )
        texts.append(tuple(_clean_text(fields[i]) for i in file_layout.text_cols))
        if file_layout.label_col is None:
            labels.append(math.nan if spec.is_regression else _UNLABELED)
        else:
            labels.append(_parse_label(spec, fields[file_layout.label_col], is_test, path, lineno))
    return _build_dataset(spec, texts, labels), file_layout.layout.name


def _find_split_file(folder: Path, split: str) -> Path | None:
    for name in _SPLIT_FILES.get(split, (f"{split}.tsv",)):
        if (folder / name).is_file():
            return folder / name
    return None


def _load_local(
    spec: TaskSpec, data_dir: Path
) -> tuple[dict[str, datasets.Dataset], dict[str, str], dict[str, str], bytes]:
    """Read every split file of a task; returns (splits, files relative to ``data_dir``,
    layouts, content digest input)."""
    folder = data_dir / spec.folder
    if not folder.is_dir():
        raise DataNotFoundError(
            f"no folder {spec.folder!r} for task {spec.name} in {data_dir}; {_HOW_TO_GET_DATA}"
        )
    splits: dict[str, datasets.Dataset] = {}
    files: dict[str, str] = {}
    layouts: dict[str, str] = {}
    raw_by_split: dict[str, bytes] = {}
    for split in ("train", *spec.dev_splits, *spec.test_splits):
        path = _find_split_file(folder, split)
        if path is None:
            if split in spec.test_splits:
                continue
            wanted = " or ".join(_SPLIT_FILES.get(split, (f"{split}.tsv",)))
            raise DataNotFoundError(
                f"no {split} file for task {spec.name} in {folder} (looked for {wanted}); "
                f"{_HOW_TO_GET_DATA}"
            )
        raw = path.read_bytes()
        splits[split], layouts[split] = _read_split_file(
            spec, path, raw, is_test=split in spec.test_splits)
        files[split] = path.relative_to(data_dir).as_posix()
        raw_by_split[split] = raw
    digest_input = b"".join(
        split.encode() + b"\0" + hashlib.sha256(raw_by_split[split]).digest()
        for split in sorted(raw_by_split)
    )
    return splits, files, layouts, digest_input


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


def _load_hub(spec: TaskSpec) -> tuple[dict[str, datasets.Dataset], bytes]:
    loaded = datasets.load_dataset(HUB_DATASET, spec.hub_config)
    splits: dict[str, datasets.Dataset] = {}
    fingerprints: dict[str, str] = {}
    for split, hub_split in spec.hub_splits:
        if hub_split not in loaded:
            if split in spec.test_splits:
                continue
            raise DataNotFoundError(f"hub {HUB_DATASET}/{spec.hub_config} has no {hub_split!r}")
        hub_ds = loaded[hub_split]
        splits[split] = _convert_hub_split(spec, hub_ds, is_test=split in spec.test_splits)
        fingerprints[split] = hub_ds._fingerprint
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
    for chosen, how in ((explicit, "--data-dir"), (os.environ.get(ENV_DATA_DIR), ENV_DATA_DIR)):
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
    if max_examples is None or max_examples >= len(ds):
        return ds, "subsample=none"
    if max_examples < 0:
        raise ValueError(f"max_train_examples must be >= 0, got {max_examples}")
    keep = np.sort(np.random.default_rng(seed).permutation(len(ds))[:max_examples])
    return ds.select(keep.tolist()).flatten_indices(), f"subsample={max_examples},seed={seed}"


def load_task(
    task: str | TaskSpec,
    source: str = "local",
    data_dir: str | Path | None = None,
    max_train_examples: int | None = None,
    subsample_seed: int = 0,
) -> TaskData:
    """Load every split of ``task`` from a GLUE-style folder or from the hub.

    ``max_train_examples`` subsamples the train split only (``idx`` keeps the original
    row numbers).  The fingerprint hashes the bytes of every file read (hub: the
    datasets' fingerprints), the source kind and the subsample spec; it does not hash
    the folder's location, so the same files give the same fingerprint wherever they
    are mounted.
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    if source == "local":
        root = resolve_data_dir(data_dir)
        splits, files, layouts, digest_input = _load_local(spec, root)
        source_name = f"local:{root}"
    elif source == "hub":
        splits, digest_input = _load_hub(spec)
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
    tab separated, no quoting, tabs and newlines in text turned into spaces), which
    :func:`load_task` reads back with ``source="local"``.
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
            rows = ["\t".join((*spec.text_fields, "label", "idx"))]
            for i in range(len(ds)):
                texts = [_clean_text(columns[f][i]) for f in spec.text_fields]
                rows.append("\t".join((*texts, _format_label(spec, columns["label"][i]), str(i))))
            path = Path(out_dir) / spec.folder / f"{split}.tsv"
            _write_atomic(path, "\n".join(rows) + "\n")
            written.append(path)
    return written
