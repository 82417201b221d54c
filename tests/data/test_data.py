"""Tests for harness.data.loading: the real shared GLUE files, tiny fixtures, fetch round trip."""

from __future__ import annotations

import math
from pathlib import Path

import datasets
import numpy as np
import pytest

import harness.data.loading as data_module
from harness.data.loading import (
    DataFormatError,
    DataNotFoundError,
    TaskData,
    check_tasks,
    fetch_glue,
    load_task,
    resolve_data_dir,
)
from harness.data.tasks import get_task

# --------------------------------------------------------------------------- helpers


def write(root: Path, folder: str, name: str, text: str, bom: bool = False) -> Path:
    """Write a fixture file byte for byte (no newline translation)."""
    path = root / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def lines(*rows: str) -> str:
    return "".join(row + "\n" for row in rows)


def column(ds: datasets.Dataset, name: str) -> list:
    return list(ds[name])


# --------------------------------------------------------------------------- real data

EXPECTED_ROWS = {
    "sst2": {"train": 67349, "dev": 872},
    "mrpc": {"train": 3668, "dev": 408, "test": 1725},
    "rte": {"train": 2490, "dev": 277, "test": 3000},
    "stsb": {"train": 5749, "dev": 1500, "test": 1379},
    "cola": {"train": 8551, "dev": 527},
}


@pytest.fixture(scope="module")
def shared_dir() -> Path:
    try:
        root = resolve_data_dir()
    except DataNotFoundError as exc:
        pytest.skip(f"shared GLUE data not available ({exc})")
    if not all((root / get_task(t).folder).is_dir() for t in EXPECTED_ROWS):
        pytest.skip(f"shared GLUE data at {root} lacks some of the five task folders")
    return root


@pytest.fixture(scope="module")
def shared_tasks(shared_dir: Path) -> dict[str, TaskData]:
    return {name: load_task(name, data_dir=shared_dir) for name in EXPECTED_ROWS}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(EXPECTED_ROWS))
def test_shared_row_counts_and_columns(shared_tasks: dict[str, TaskData], task: str) -> None:
    loaded = shared_tasks[task]
    spec = get_task(task)
    assert {split: len(ds) for split, ds in loaded.splits.items()} == EXPECTED_ROWS[task]
    assert loaded.source.startswith("local:")
    assert set(loaded.files) == set(EXPECTED_ROWS[task])
    for ds in loaded.splits.values():
        expected_cols = (
            ["text_a", "text_b", "label", "idx"] if spec.is_pair else ["text_a", "label", "idx"]
        )
        assert ds.column_names == expected_cols
        assert ds.features["label"].dtype == ("float32" if spec.is_regression else "int64")
        assert ds.features["idx"].dtype == "int64"
        assert column(ds, "idx")[:3] == [0, 1, 2]


def test_shared_mrpc_bom_and_literal_quotes(shared_tasks: dict[str, TaskData]) -> None:
    train = shared_tasks["mrpc"].splits["train"]
    assert train[0]["text_a"].startswith("Amrozi")
    assert '"the witness"' in train[0]["text_a"]
    assert set(column(train, "label")) == {0, 1}
    assert set(column(shared_tasks["mrpc"].splits["test"], "label")) == {-1}


def test_shared_cola_is_the_original_glue_release(shared_tasks: dict[str, TaskData]) -> None:
    """Headerless source / label / judgement / sentence rows, cased and untokenised."""
    loaded = shared_tasks["cola"]
    assert loaded.layouts == {"train": "glue-cola", "dev": "glue-cola"}
    train = loaded.splits["train"]
    assert train[0]["text_a"] == ("Our friends won't buy this analysis, let alone the next "
                                  "one we propose.")
    assert set(column(train, "label")) == {0, 1}
    assert sum(column(loaded.splits["dev"], "label")) == 365  # 365 of 527 acceptable


def test_the_lowercased_cola_variant_is_read_as_a_fixture(shared_dir: Path) -> None:
    """The tokenised, lowercased CoLA copy that circulates publicly (sentence, label; no
    header) is recognised by its own layout, never mistaken for the original."""
    variant_dir = shared_dir.parent / "glue-variants"
    if not (variant_dir / "CoLA").is_dir():
        pytest.skip(f"no CoLA variant fixture at {variant_dir}")
    variant = load_task("cola", data_dir=variant_dir)
    assert {split: len(ds) for split, ds in variant.splits.items()} == {"train": 8551,
                                                                       "dev": 516}
    assert variant.layouts == {"train": "cola-variant", "dev": "cola-variant"}
    assert column(variant.splits["train"], "text_a")[0].islower()


def test_shared_sst2_text_is_stripped(shared_tasks: dict[str, TaskData]) -> None:
    train = shared_tasks["sst2"].splits["train"]
    assert train[0]["text_a"] == "hide new secretions from the parental units"


def test_shared_stsb_scores_are_floats_in_range(shared_tasks: dict[str, TaskData]) -> None:
    for split, ds in shared_tasks["stsb"].splits.items():
        labels = np.asarray(column(ds, "label"), dtype=np.float64)
        assert np.all((labels >= 0) & (labels <= 5)), split
        assert len(np.unique(labels)) > 10, split  # real scores, test included


def test_shared_rte_test_is_unlabeled(shared_tasks: dict[str, TaskData]) -> None:
    assert set(column(shared_tasks["rte"].splits["test"], "label")) == {-1}
    assert set(column(shared_tasks["rte"].splits["train"], "label")) == {0, 1}


def test_shared_fingerprint_stable_and_subsample_sensitive(
    shared_dir: Path, shared_tasks: dict[str, TaskData]
) -> None:
    again = load_task("rte", data_dir=shared_dir)
    assert again.fingerprint == shared_tasks["rte"].fingerprint
    assert len(again.fingerprint) == 64
    sub = load_task("rte", data_dir=shared_dir, max_train_examples=100)
    assert sub.fingerprint != again.fingerprint
    other_seed = load_task("rte", data_dir=shared_dir, max_train_examples=100, subsample_seed=1)
    assert other_seed.fingerprint not in (sub.fingerprint, again.fingerprint)
    assert len({t.fingerprint for t in shared_tasks.values()}) == len(shared_tasks)


def test_shared_subsample_deterministic_keeps_idx(
    shared_dir: Path, shared_tasks: dict[str, TaskData]
) -> None:
    full = shared_tasks["rte"].splits["train"]
    first = load_task("rte", data_dir=shared_dir, max_train_examples=100, subsample_seed=3)
    second = load_task("rte", data_dir=shared_dir, max_train_examples=100, subsample_seed=3)
    idx = column(first.splits["train"], "idx")
    assert idx == column(second.splits["train"], "idx")
    assert len(idx) == 100 and idx == sorted(idx) and len(set(idx)) == 100
    expected = np.sort(np.random.default_rng(3).permutation(len(full))[:100]).tolist()
    assert idx == expected
    assert column(first.splits["train"], "text_a") == [full[i]["text_a"] for i in idx]
    assert len(first.splits["dev"]) == len(shared_tasks["rte"].splits["dev"])


# --------------------------------------------------------------------------- malformed files

SST2_DEV = lines("sentence\tlabel", "fine .\t1")


@pytest.mark.parametrize(
    ("folder", "name", "text", "line", "needle"),
    [
        (
            "SST-2",
            "train.tsv",
            lines("sentence\tlabel", "good .\t1", "no label here"),
            3,
            "expected 2 tab-separated fields, got 1",
        ),
        ("SST-2", "train.tsv", lines("sentence\tlabel", "a\t1", "b\t0", "c\t1\textra"), 4, "got 3"),
        ("SST-2", "train.tsv", lines("sentence\tlabel", "a\t1", "b\tpositive-ish"), 3, "label"),
        ("SST-2", "train.tsv", lines("sentence\tlabel", "a\t2"), 2, "label"),
        ("SST-2", "train.tsv", lines("sentence\tlabel", "a\t1", "b\t-1"), 3, "label"),
        ("SST-2", "train.tsv", lines("text\tlabel", "a\t1"), 1, "unrecognised header"),
        ("SST-2", "train.tsv", lines("index\tsentence", "0\ta"), 1, "no label column"),
        (
            "RTE",
            "train.tsv",
            lines("index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\tc\td\tmaybe"),
            3,
            "maybe",
        ),
        (
            "RTE",
            "train.tsv",
            lines("premise\thypothesis\tlabel\tidx", "a\tb\t0\t0"),
            1,
            "unrecognised header",
        ),
        (
            "STS-B",
            "sts-train.csv",
            lines("g\tf\t2012\t0001\t5.000\ta\tb", "g\tf\t2012\t0002\thigh\tc\td"),
            2,
            "not a number",
        ),
        (
            "STS-B",
            "sts-train.csv",
            lines("g\tf\t2012\t0001\t5.000\ta\tb", "g\tf\t2012\t0002\t4.0\tc"),
            2,
            "expected 7 or 9 tab-separated fields, got 6",
        ),
        (
            "CoLA",
            "train.tsv",
            lines("gj04\t1\t\tok .", "gj04\t1\t\tfine .", "gj04\t1"),
            3,
            "expected 4",
        ),
    ],
)
def test_malformed_train_file(
    tmp_path: Path, folder: str, name: str, text: str, line: int, needle: str
) -> None:
    path = write(tmp_path, folder, name, text)
    task = {"SST-2": "sst2", "RTE": "rte", "STS-B": "stsb", "CoLA": "cola"}[folder]
    with pytest.raises(DataFormatError) as info:
        load_task(task, data_dir=tmp_path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message
    assert info.value.path == path and info.value.line == line


@pytest.mark.parametrize(("task", "folder", "files", "key"), [
    ("mrpc", "MRPC", ("train.tsv", "dev.tsv"), "(#1 ID, #2 ID)"),
    ("stsb", "STS-B", ("sts-train.csv", "sts-dev.csv"), "(genre, file, year, id)"),
])
def test_a_repeated_row_of_the_shared_files_is_named_with_its_first_line(
        shared_dir: Path, tmp_path: Path, task: str, folder: str, files: tuple[str, ...],
        key: str) -> None:
    """MRPC's and the STS Benchmark's files have no row numbers; every real row differs in
    its ids, so a repeat (scored twice) is refused where it stands."""
    (tmp_path / folder).mkdir()
    for name in files:
        (tmp_path / folder / name).write_bytes((shared_dir / folder / name).read_bytes())
    assert len(load_task(task, data_dir=tmp_path).splits["dev"]) > 0  # as shipped: fine
    dev = tmp_path / folder / files[1]
    rows = dev.read_bytes().splitlines(keepends=True)
    dev.write_bytes(b"".join([*rows[:9], rows[5], *rows[9:]]))  # line 6 again as line 10
    with pytest.raises(DataFormatError) as info:
        load_task(task, data_dir=tmp_path)
    assert info.value.path == dev and info.value.line == 10
    assert f"{key} of line 6" in str(info.value)


def test_malformed_dev_file_names_dev(tmp_path: Path) -> None:
    write(tmp_path, "SST-2", "train.tsv", SST2_DEV)
    dev = write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel", "a\t1", "", "b\t7"))
    with pytest.raises(DataFormatError, match=r"dev\.tsv:4: label '7'"):
        load_task("sst2", data_dir=tmp_path)
    assert dev.exists()


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="MNLI") as info:
        load_task("mnli", data_dir=tmp_path)
    assert "HARNESS_DATA_DIR" in str(info.value)
    write(tmp_path, "SST-2", "train.tsv", SST2_DEV)
    with pytest.raises(DataNotFoundError, match=r"dev\.tsv") as info:
        load_task("sst2", data_dir=tmp_path)
    assert str(tmp_path / "SST-2") in str(info.value)
    write(tmp_path, "SST-2", "dev.tsv", SST2_DEV)
    assert set(load_task("sst2", data_dir=tmp_path).splits) == {"train", "dev"}


# --------------------------------------------------------------------------- original layouts


def test_bom_crlf_and_literal_quotes(tmp_path: Path) -> None:
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    text = f'{header}\r\n1\t1\t2\t"Quoted\t  open quote\r\n0\t3\t4\tx\ty\r\n'
    write(tmp_path, "MRPC", "train.tsv", text, bom=True)
    write(tmp_path, "MRPC", "dev.tsv", text, bom=True)
    loaded = load_task("mrpc", data_dir=tmp_path)
    train = loaded.splits["train"]
    assert column(train, "text_a") == ['"Quoted', "x"]
    assert column(train, "text_b") == ["open quote", "y"]
    assert column(train, "label") == [1, 0]
    assert "test" not in loaded.splits


def test_glue_cola_four_columns(tmp_path: Path) -> None:
    rows = lines("gj04\t1\t\tOur friends won't buy this analysis.", "gj04\t0\t*\tThem is bad.")
    write(tmp_path, "CoLA", "train.tsv", rows)
    write(tmp_path, "CoLA", "dev.tsv", rows)
    write(tmp_path, "CoLA", "test.tsv", lines("index\tsentence", "0\tA test sentence."))
    loaded = load_task("cola", data_dir=tmp_path)
    train = loaded.splits["train"]
    assert train.column_names == ["text_a", "label", "idx"]
    assert column(train, "text_a") == ["Our friends won't buy this analysis.", "Them is bad."]
    assert column(train, "label") == [1, 0]
    assert column(loaded.splits["test"], "label") == [-1]


def test_glue_qnli_text_labels(tmp_path: Path) -> None:
    header = "index\tquestion\tsentence\tlabel"
    rows = lines(header, "0\tWho?\tHim.\tentailment", "1\tWhen?\tNever.\tnot_entailment")
    write(tmp_path, "QNLI", "train.tsv", rows)
    write(tmp_path, "QNLI", "dev.tsv", rows)
    write(tmp_path, "QNLI", "test.tsv", lines("index\tquestion\tsentence", "0\tWhy?\tBecause."))
    loaded = load_task("qnli", data_dir=tmp_path)
    assert column(loaded.splits["train"], "label") == [0, 1]
    assert column(loaded.splits["train"], "text_b") == ["Him.", "Never."]
    assert loaded.splits["test"][0] == {
        "text_a": "Why?",
        "text_b": "Because.",
        "label": -1,
        "idx": 0,
    }


MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)


def mnli_row(i: int, premise: str, hypothesis: str, *labels: str) -> str:
    return "\t".join(
        (str(i), "1", f"{i}e", "fiction", "(", "(", "(", "(", premise, hypothesis, *labels)
    )


def test_glue_mnli_matched_and_mismatched_kept_apart(tmp_path: Path) -> None:
    write(
        tmp_path,
        "MNLI",
        "train.tsv",
        lines(
            MNLI_HEADER + "\tlabel1\tgold_label",
            mnli_row(0, "P0", "H0", "neutral", "neutral"),
            mnli_row(1, "P1", "H1", "entailment", "entailment"),
        ),
    )
    dev_header = MNLI_HEADER + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
    five = ("neutral",) * 5
    write(
        tmp_path,
        "MNLI",
        "dev_matched.tsv",
        lines(dev_header, mnli_row(0, "Pm", "Hm", *five, "contradiction")),
    )
    write(
        tmp_path,
        "MNLI",
        "dev_mismatched.tsv",
        lines(
            dev_header,
            mnli_row(0, "Px", "Hx", *five, "neutral"),
            mnli_row(1, "Py", "Hy", *five, "entailment"),
        ),
    )
    write(tmp_path, "MNLI", "test_matched.tsv", lines(MNLI_HEADER, mnli_row(0, "Pt", "Ht")))
    loaded = load_task("mnli", data_dir=tmp_path)
    assert list(loaded.splits) == ["train", "dev_matched", "dev_mismatched", "test_matched"]
    assert column(loaded.splits["train"], "label") == [1, 0]
    assert column(loaded.splits["dev_matched"], "text_a") == ["Pm"]
    assert column(loaded.splits["dev_matched"], "label") == [2]
    assert column(loaded.splits["dev_mismatched"], "text_b") == ["Hx", "Hy"]
    assert column(loaded.splits["dev_mismatched"], "label") == [1, 0]
    assert column(loaded.splits["test_matched"], "label") == [-1]
    assert loaded.files["dev_mismatched"].endswith("dev_mismatched.tsv")


def test_glue_stsb_tsv(tmp_path: Path) -> None:
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    row = "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tAn air plane."
    write(tmp_path, "STS-B", "train.tsv", lines(header + "\tscore", row + "\t3.800"))
    write(tmp_path, "STS-B", "dev.tsv", lines(header + "\tscore", row + "\t0.5"))
    write(tmp_path, "STS-B", "test.tsv", lines(header, row))
    loaded = load_task("stsb", data_dir=tmp_path)
    train = loaded.splits["train"]
    assert train.features["label"].dtype == "float32"
    assert train[0]["text_a"] == "A plane." and train[0]["text_b"] == "An air plane."
    assert train[0]["label"] == pytest.approx(3.8)
    assert math.isnan(loaded.splits["test"][0]["label"])


@pytest.mark.parametrize(
    ("task", "folder", "rows", "labels"),
    [
        (
            "qqp",
            "QQP",
            [
                "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                "0\t1\t2\tq a?\tq b?\t1",
                "1\t3\t4\tq c?\tq d?\t0",
            ],
            [1, 0],
        ),
        (
            "wnli",
            "WNLI",
            ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\t1", "1\tc\td\t0"],
            [1, 0],
        ),
        (
            "rte",
            "RTE",
            [
                "index\tsentence1\tsentence2\tlabel",
                "0\ta\tb\tnot_entailment",
                "1\tc\td\tentailment",
            ],
            [1, 0],
        ),
        ("sst2", "SST-2", ["sentence\tlabel", "a \t1", "b \t0"], [1, 0]),
    ],
)
def test_other_glue_layouts(
    tmp_path: Path, task: str, folder: str, rows: list[str], labels: list[int]
) -> None:
    write(tmp_path, folder, "train.tsv", lines(*rows))
    write(tmp_path, folder, "dev.tsv", lines(*rows))
    train = load_task(task, data_dir=tmp_path).splits["train"]
    assert column(train, "label") == labels
    assert column(train, "idx") == [0, 1]
    assert all(text == text.strip() and text for text in column(train, "text_a"))


@pytest.mark.parametrize(("task", "folder", "header", "row", "owner"), [
    ("rte", "RTE", "index\tquestion\tsentence\tlabel", "0\tWho?\tHim.\tentailment", "qnli"),
    ("rte", "RTE", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t1\t2\ta\tb", "mrpc"),
    ("mrpc", "MRPC", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
     "0\t1\t2\tq a?\tq b?\t1", "qqp"),
])
def test_another_task_s_glue_file_is_refused(tmp_path: Path, task: str, folder: str,
                                            header: str, row: str, owner: str) -> None:
    """GLUE's own header of one task (QNLI's question / sentence, MRPC's ids, QQP's
    question ids) in another task's folder is that task's file: QNLI's labels are RTE's,
    so it would train and score as RTE without a word."""
    train = write(tmp_path, folder, "train.tsv", lines(header, row))
    write(tmp_path, folder, "dev.tsv", lines(header, row))
    with pytest.raises(DataFormatError, match="unrecognised header") as info:
        load_task(task, data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 1)
    assert f"the header of {owner}'s files" in str(info.value)


@pytest.mark.parametrize(
    ("owner", "owner_folder", "reader", "reader_folder", "rows", "extra"), [
        ("sst2", "SST-2", "cola", "CoLA", ["sentence\tlabel", "a film \t1", "a dud \t0"],
         "the cat sat \t1"),
        ("rte", "RTE", "wnli", "WNLI", ["index\tsentence1\tsentence2\tlabel",
                                        "0\ta\tb\tnot_entailment", "1\tc\td\tentailment"],
         "2\te\tf\tentailment"),
    ])
def test_one_task_s_file_in_another_task_s_folder_is_refused(
        tmp_path: Path, owner: str, owner_folder: str, reader: str, reader_folder: str,
        rows: list[str], extra: str) -> None:
    """SST-2's files pass as CoLA's (the lowercased variant's layout) and RTE's as
    WNLI's: a folder filled from the wrong task is caught by being another folder's file,
    and both tasks are refused until each holds its own."""
    train = lines(*rows)
    dev = lines(*rows[:2])
    write(tmp_path, owner_folder, "train.tsv", train)
    write(tmp_path, owner_folder, "dev.tsv", dev)
    copied_train = write(tmp_path, reader_folder, "train.tsv", train)
    copied_dev = write(tmp_path, reader_folder, "dev.tsv", dev)
    with pytest.raises(DataFormatError) as info:
        load_task(reader, data_dir=tmp_path)
    assert [(error.path, error.line) for error in info.value.errors] \
        == [(copied_train, None), (copied_dev, None)]
    assert f"it is {tmp_path / owner_folder / 'train.tsv'} byte for byte" in str(info.value)
    with pytest.raises(DataFormatError, match=f"{reader_folder}/dev.tsv byte for byte"):
        load_task(owner, data_dir=tmp_path)

    own = lines(*rows, extra)  # the reader's own rows: one more than the owner's
    copied_train.write_bytes(own.encode())
    copied_dev.write_bytes(own.encode())
    assert load_task(reader, data_dir=tmp_path).splits["train"].num_rows == 3
    assert load_task(owner, data_dir=tmp_path).splits["train"].num_rows == 2


# --------------------------------------------------------------------------- fetch round trip


def fake_glue(config: str) -> datasets.DatasetDict:
    """A tiny stand-in for ``load_dataset("nyu-mll/glue", config)``."""
    spec = get_task(config)
    if spec.is_regression:
        label_feature = datasets.Value("float32")
    else:
        label_feature = datasets.ClassLabel(names=list(spec.label_names))

    def split(n: int, unlabeled: bool, tag: str) -> datasets.Dataset:
        cols: dict[str, list] = {
            field: [f' {tag} {field} {i}\twith tab\nand newline "q" ' for i in range(n)]
            for field in spec.text_fields
        }
        if unlabeled:
            cols["label"] = [-1] * n
        elif spec.is_regression:
            cols["label"] = [round(0.3 + 1.1 * i, 2) % 5 for i in range(n)]
        else:
            cols["label"] = [i % spec.num_labels for i in range(n)]
        cols["idx"] = list(range(n))
        features = {f: datasets.Value("string") for f in spec.text_fields}
        features |= {"label": label_feature, "idx": datasets.Value("int32")}
        return datasets.Dataset.from_dict(cols, features=datasets.Features(features))

    return datasets.DatasetDict(
        {
            hub: split(5 + k, unlabeled=harness in spec.test_splits, tag=hub)
            for k, (harness, hub) in enumerate(spec.hub_splits)
        }
    )


def fake_load_dataset(path: str, config: str) -> datasets.DatasetDict:
    assert path == "nyu-mll/glue"
    return fake_glue(config)


def expected_text(raw: str) -> str:
    return raw.replace("\t", " ").replace("\n", " ").strip()


@pytest.mark.parametrize("task", ["sst2", "rte", "stsb", "mnli"])
def test_fetch_glue_round_trip(tmp_path: Path, task: str) -> None:
    spec = get_task(task)
    written = fetch_glue([task], tmp_path, load_fn=fake_load_dataset)
    assert written == [tmp_path / spec.folder / f"{split}.tsv" for split, _ in spec.hub_splits]
    assert sorted(p.name for p in (tmp_path / spec.folder).iterdir()) == sorted(
        p.name for p in written
    )
    header = written[0].read_text(encoding="utf-8").split("\n")[0]
    assert header == "\t".join((*spec.text_fields, "label", "idx"))

    loaded = load_task(task, source="local", data_dir=tmp_path)
    hub = fake_glue(spec.hub_config)
    assert list(loaded.splits) == [split for split, _ in spec.hub_splits]
    for split, hub_split in spec.hub_splits:
        got, want = loaded.splits[split], hub[hub_split]
        assert column(got, "text_a") == [expected_text(t) for t in want[spec.text_fields[0]]]
        if spec.is_pair:
            assert column(got, "text_b") == [expected_text(t) for t in want[spec.text_fields[1]]]
        want_labels = list(want["label"])
        if spec.is_regression and split in spec.test_splits:
            assert all(math.isnan(x) for x in column(got, "label"))
        elif spec.is_regression:
            assert np.allclose(column(got, "label"), want_labels)
            assert np.array_equal(
                np.asarray(column(got, "label"), np.float32), np.asarray(want_labels, np.float32)
            )
        else:
            assert column(got, "label") == want_labels
        assert column(got, "idx") == list(range(len(want)))


def test_hub_source_matches_fetched_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_module.datasets, "load_dataset", fake_load_dataset)
    fetch_glue(["stsb", "mrpc"], tmp_path, load_fn=fake_load_dataset)
    for task in ("stsb", "mrpc"):
        hub = load_task(task, source="hub")
        local = load_task(task, data_dir=tmp_path)
        assert hub.source == "hub:nyu-mll/glue" and hub.files == {}
        assert len(hub.fingerprint) == 64
        for split, ds in hub.splits.items():
            assert ds.features == local.splits[split].features
            assert column(ds, "text_a") == column(local.splits[split], "text_a")
            np.testing.assert_array_equal(column(ds, "label"), column(local.splits[split], "label"))
        # As a run loads them: the test split hashed, not read
        for full in (hub, local):
            run = load_task(task, source=full.source.split(":")[0], data_dir=tmp_path,
                            test_splits=False)
            assert (run.fingerprint, run.files) == (full.fingerprint, full.files)
            assert set(run.splits) == {"train", "dev"} and "test" in full.splits
    sub = load_task("mrpc", source="hub", max_train_examples=2)
    assert column(sub.splits["train"], "idx") == sorted(
        np.random.default_rng(0).permutation(5)[:2].tolist()
    )
    assert sub.fingerprint != load_task("mrpc", source="hub").fingerprint


def test_a_hub_dataset_that_cannot_be_reached_says_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline (the tests run with HF_HUB_OFFLINE=1) and not cached: the hub's GLUE and a
    hub corpus name the local alternative instead of ending in datasets' ConnectionError."""
    from harness.config.schema import CorpusConfig, HubTextDataset
    from harness.data.corpus import build_corpus

    monkeypatch.setattr(data_module, "HUB_DATASET", "distill-bench-tests/no-such-glue")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)  # the message names what is set
    with pytest.raises(DataNotFoundError) as info:
        load_task("rte", source="hub")
    message = str(info.value)
    assert "distill-bench-tests/no-such-glue/rte cannot be loaded" in message
    assert "HF_HUB_OFFLINE is set" in message and "--data-dir DIR" in message
    corpus = CorpusConfig(task_sentences=False, hub_dataset=HubTextDataset(
        path="distill-bench-tests/no-such-corpus", name="raw"))
    with pytest.raises(DataNotFoundError, match=r"no-such-corpus/raw .*corpus\.text_files"):
        build_corpus(corpus, [])


def test_unknown_source() -> None:
    with pytest.raises(ValueError, match="source"):
        load_task("rte", source="ftp")


# --------------------------------------------------------------------------- resolve_data_dir


def test_resolve_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    env.mkdir()
    repo = tmp_path / "repo"
    default = tmp_path / "shared" / "data" / "glue"
    default.mkdir(parents=True)
    monkeypatch.setattr(data_module, "__file__", str(repo / "harness" / "data" / "loading.py"))

    monkeypatch.setenv("HARNESS_DATA_DIR", str(env))
    assert resolve_data_dir(explicit) == explicit
    assert resolve_data_dir(str(explicit)) == explicit
    assert resolve_data_dir() == env
    monkeypatch.delenv("HARNESS_DATA_DIR")
    assert resolve_data_dir() == default

    default.rmdir()
    with pytest.raises(DataNotFoundError) as info:
        resolve_data_dir()
    for hint in ("HARNESS_DATA_DIR", "--data-dir", "harness data fetch"):
        assert hint in str(info.value)
    with pytest.raises(DataNotFoundError, match="HARNESS_DATA_DIR"):
        resolve_data_dir(tmp_path / "nowhere")


# --------------------------------------------------------------------------- strict checks

STSB_ROW = "main-captions\tMSRvid\t2012test\t0001\t{score}\tA plane is taking off.\tA plane."


@pytest.mark.parametrize(("name", "text", "line", "needle"), [
    # a header and no rows
    ("train.tsv", lines("sentence\tlabel"), None, "no data rows (expected at least one row "
                                                   "after the header)"),
    # a header naming a column twice
    ("train.tsv", lines("sentence\tlabel\tlabel", "a\t1\t1"), 1, "header repeats column(s) "
                                                                  "['label']"),
    # a byte that is not UTF-8: its line and column
    ("train.tsv", "sentence\tlabel\nok\t1\nbad \xff\t0\n", 3, "byte 0xff at column 5 is not "
                                                             "UTF-8"),
    # an empty text
    ("train.tsv", lines("sentence\tlabel", "a\t1", " \t0"), 3, "sentence is empty"),
])
def test_sst2_files_are_checked(tmp_path: Path, name: str, text: str, line: int | None,
                                needle: str) -> None:
    path = tmp_path / "SST-2" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    write(tmp_path, "SST-2", "dev.tsv", SST2_DEV)
    with pytest.raises(DataFormatError) as info:
        load_task("sst2", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (path, line), str(info.value)
    assert needle in str(info.value)


@pytest.mark.parametrize(("row", "needle"), [
    (STSB_ROW.format(score="7.5"), "score '7.5' is outside 0-5"),
    (STSB_ROW.format(score="-3"), "score '-3' is outside 0-5"),
    (STSB_ROW.format(score="nan"), "score 'nan' is not a finite number"),
    # one field added after the genre: the year column then reads "MSRvid"
    ("main-captions\tEXTRA\tMSRvid\t2012test\t0001\t5.000\tA plane.\tA plane.",
     "expected 7 or 9 tab-separated fields, got 8"),
    ("main-captions\tEXTRA\tMSRvid\t2012test\t0001\t5.000\tA plane.\tA plane.\tsrc",
     "year 'MSRvid' is not a year"),
    # the id column shifted into the score: caught by the id's own check
    ("main-captions\tMSRvid\t2012test\t5.000\t0001\tA plane.\tA plane.",
     "id '5.000' is not an integer id"),
])
def test_headerless_stsb_rows_are_checked_column_by_column(tmp_path: Path, row: str,
                                                           needle: str) -> None:
    train = write(tmp_path, "STS-B", "sts-train.csv",
                  lines(STSB_ROW.format(score="5.000"), row))
    write(tmp_path, "STS-B", "sts-dev.csv", lines(STSB_ROW.format(score="3.800")))
    with pytest.raises(DataFormatError) as info:
        load_task("stsb", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 2), str(info.value)
    assert needle in str(info.value)


def test_every_problem_of_every_file_is_listed(tmp_path: Path) -> None:
    train = write(tmp_path, "SST-2", "train.tsv",
                  lines("sentence\tlabel", "a\t1", "b\t7", "c\t0", "d"))
    dev = write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel", "e\tyes"))
    with pytest.raises(DataFormatError) as info:
        load_task("sst2", data_dir=tmp_path)
    message = str(info.value).splitlines()
    assert [line.split(": ")[0] for line in message] == [f"{train}:3", f"{train}:5",
                                                          f"{dev}:2"]


def test_rows_numbered_by_idx_must_be_in_order(tmp_path: Path) -> None:
    header = "sentence1\tsentence2\tlabel\tidx"
    train = write(tmp_path, "RTE", "train.tsv", lines(header, "a\tb\t1\t0", "c\td\t1\t0"))
    write(tmp_path, "RTE", "dev.tsv", lines(header, "a\tb\t0\t0"))
    with pytest.raises(DataFormatError) as info:
        load_task("rte", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 3)
    assert "row number '0' is not this row's (expected 1" in str(info.value)


# --------------------------------------------------------------------------- Hugging Face exports


def export(dataset: datasets.Dataset, path: Path, fmt: str) -> None:
    """Write ``dataset`` as the ``datasets`` library does for each format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        dataset.to_parquet(str(path))
    elif fmt == "jsonl":
        dataset.to_json(str(path))
    elif fmt == "csv":
        dataset.to_csv(str(path), index=False)
    else:
        dataset.to_csv(str(path), index=False, sep="\t")


def as_hub_split(loaded: datasets.Dataset, task: str, names: list[str] | None = None
                 ) -> datasets.Dataset:
    """A split as the hub's nyu-mll/glue holds it: the task's own field names, a
    ClassLabel (with ``names``, default the task's) and idx."""
    spec = get_task(task)
    columns = {spec.text_fields[0]: loaded["text_a"]}
    if spec.is_pair:
        columns[spec.text_fields[1]] = loaded["text_b"]
    labels = loaded["label"]
    if spec.is_regression:
        feature = datasets.Value("float32")
    else:
        names = names or list(spec.label_names)
        feature = datasets.ClassLabel(names=names)
        labels = [names.index(spec.label_names[label]) for label in labels]
    columns["label"], columns["idx"] = labels, list(range(len(labels)))
    features = datasets.Features({**{field: datasets.Value("string")
                                     for field in spec.text_fields},
                                  "label": feature, "idx": datasets.Value("int32")})
    return datasets.Dataset.from_dict(columns, features=features)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "tsv"])
@pytest.mark.parametrize("task", ["rte", "stsb"])
def test_hugging_face_exports_read_as_the_original_files(
        shared_tasks: dict[str, TaskData], tmp_path: Path, task: str, fmt: str) -> None:
    original = shared_tasks[task]
    folder = tmp_path / get_task(task).folder
    for split, hub_split in (("train", "train"), ("dev", "validation")):
        rows = original.splits[split].select(range(50))
        export(as_hub_split(rows, task), folder / f"{hub_split}.{fmt}", fmt)
    loaded = load_task(task, data_dir=tmp_path)
    assert set(loaded.splits) == {"train", "dev"}
    assert loaded.layouts == {"train": "hf-export", "dev": "hf-export"}
    assert loaded.files["dev"] == f"{folder.name}/validation.{fmt}"
    for split in ("train", "dev"):
        expected = original.splits[split].select(range(50))
        assert loaded.splits[split]["text_a"] == expected["text_a"]
        assert loaded.splits[split]["text_b"] == expected["text_b"]
        assert loaded.splits[split]["label"] == pytest.approx(expected["label"])


def test_an_export_s_label_names_are_mapped_by_name(shared_tasks: dict[str, TaskData],
                                                    tmp_path: Path) -> None:
    """A parquet export whose ClassLabel lists the names in another order, and a JSON
    lines file holding the names themselves, read as the task's label ids."""
    rows = shared_tasks["rte"].splits["train"].select(range(20))
    dev_rows = shared_tasks["rte"].splits["train"].select(range(20, 40))
    folder = tmp_path / "RTE"
    export(as_hub_split(rows, "rte", names=["not_entailment", "entailment"]),
           folder / "train.parquet", "parquet")
    named = [{"sentence1": a, "sentence2": b, "label": get_task("rte").label_names[label]}
             for a, b, label in zip(dev_rows["text_a"], dev_rows["text_b"],
                                    dev_rows["label"], strict=True)]
    folder.joinpath("validation.jsonl").write_text(
        "".join(__import__("json").dumps(item) + "\n" for item in named))
    loaded = load_task("rte", data_dir=tmp_path)
    assert loaded.splits["train"]["label"] == rows["label"]
    assert loaded.splits["dev"]["label"] == dev_rows["label"]


def test_mnli_exports_keep_matched_and_mismatched_apart(tmp_path: Path) -> None:
    def split(premises: list[str], labels: list[int]) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"premise": premises, "hypothesis": [f"h {p}" for p in premises],
             "label": labels, "idx": list(range(len(labels)))},
            features=datasets.Features({
                "premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                "idx": datasets.Value("int32")}))

    folder = tmp_path / "MNLI"
    export(split(["a", "b"], [0, 1]), folder / "train.jsonl", "jsonl")
    export(split(["m"], [2]), folder / "validation_matched.jsonl", "jsonl")
    export(split(["x", "y"], [1, 0]), folder / "validation_mismatched.jsonl", "jsonl")
    loaded = load_task("mnli", data_dir=tmp_path)
    assert column(loaded.splits["dev_matched"], "label") == [2]
    assert column(loaded.splits["dev_mismatched"], "text_a") == ["x", "y"]


def test_two_files_for_one_split_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "SST-2", "train.tsv", SST2_DEV)
    write(tmp_path, "SST-2", "dev.tsv", SST2_DEV)
    write(tmp_path, "SST-2", "validation.tsv", SST2_DEV)
    with pytest.raises(DataFormatError, match=r"several files for the dev split \(dev\.tsv, "
                                              r"validation\.tsv\); keep one"):
        load_task("sst2", data_dir=tmp_path)


@pytest.mark.e2e
def test_data_check_reports_rows_or_every_error(shared_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from harness.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["data", "check", "--data-dir", str(shared_dir),
                                 "--tasks", "rte,cola"])
    assert result.exit_code == 0, result.output
    assert "rte    train 2490 (RTE/train.tsv, hf-export)  dev 277" in result.output
    assert "cola   train 8551 (CoLA/train.tsv, glue-cola)  dev 527" in result.output
    assert "2 task(s) checked; no errors" in result.output
    write(tmp_path, "SST-2", "train.tsv", lines("sentence\tlabel", "a\t1", "b\t9"))
    write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel"))
    result = runner.invoke(app, ["data", "check", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path}/SST-2/train.tsv:3: label '9' is not a label of sst2" in result.output
    assert f"{tmp_path}/SST-2/dev.tsv: no data rows" in result.output
    assert "1 task(s) checked; 1 with errors: sst2" in result.output


def test_a_run_hashes_the_test_splits_and_reads_only_train_and_dev(
        tmp_path: Path, tiny_teacher_dir: Path) -> None:
    """A run prepares a task's training and dev splits: its test files (gold labels hidden,
    used by nothing) enter the data fingerprint byte for byte, as when they are read
    (an RTE export read with its quoting, STS-B's headerless CSV), and are not parsed nor
    tokenised, so a malformed one stops ``harness data check``, not a run."""
    import torch
    import yaml

    from harness.experiments.planner import RunPlanner
    from harness.experiments.suites import load_suite
    from tests.conftest import tiny_suite_dict, write_tiny_glue

    write_tiny_glue(tmp_path / "glue", rows=8)
    rte_test = write(tmp_path / "glue", "RTE", "test.tsv", lines(
        "sentence1\tsentence2\tlabel\tidx", '"He said ""no""."\tHe spoke.\t-1\t0'))
    write(tmp_path / "glue", "STS-B", "sts-test.csv",
          "main-captions\tMSRvid\t2012test\t0001\t\tA plane.\tAn air plane.\n")
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tmp_path / "glue", tiny_teacher_dir)))
    suite = load_suite(str(suite_file))

    def prepare(task: str):
        return RunPlanner(suite, torch.device("cpu"), log=lambda _: None).prepare_task(task)

    fingerprints = {}
    for task, test_file in (("rte", "RTE/test.tsv"), ("stsb", "STS-B/sts-test.csv")):
        full = load_task(task, data_dir=tmp_path / "glue")
        assert len(full.splits["test"]) == 1
        prepared = prepare(task)
        assert set(prepared.splits) == set(prepared.data.splits) == {"train", "dev"}
        assert prepared.data.fingerprint == full.fingerprint  # run ids and teacher keys
        assert prepared.data.files == full.files and full.files["test"] == test_file
        assert set(prepared.data.layouts) == {"train", "dev"}
        fingerprints[task] = full.fingerprint
    rte_test.write_text(lines("sentence1\tsentence2\tlabel\tidx", "one field"))
    assert prepare("rte").data.fingerprint != fingerprints["rte"]  # its bytes are hashed
    _, (check,) = check_tasks(["rte"], tmp_path / "glue")
    assert check.errors == [f"{rte_test}:2: expected 4 tab-separated fields, got 1"]


def test_a_tsv_export_is_read_with_its_quoting(shared_tasks: dict[str, TaskData]) -> None:
    """The shared RTE files are a pandas-written TSV export: a field with a quote is
    wrapped in quotes and its quotes doubled.  They read as the sentences themselves,
    while GLUE's own TSVs (MRPC) keep their quotes literally."""
    train = shared_tasks["rte"].splits["train"]
    valero = next(text for text in train["text_a"] if text.startswith("Valero Energy"))
    assert valero == ("Valero Energy Corp., on Monday, said it found \"extensive\" additional "
                      "damage at its 250,000-barrel-per-day Port Arthur refinery.")
    texts = [*train["text_a"], *train["text_b"]]
    assert not any('""' in text for text in texts)  # no doubled quote is left
    # 504 fields were wrapped in quotes by the export; 6 sentences are quotations
    assert sum(text.startswith('"') and text.endswith('"') for text in texts) == 6
    assert '"the witness"' in shared_tasks["mrpc"].splits["train"][0]["text_a"]


# --------------------------------------------------------------------------- row numbers, caps


def test_a_quoted_record_over_several_lines_is_reported_at_its_first_line(
        tmp_path: Path) -> None:
    header = "sentence\tlabel\tidx"  # a Hugging Face TSV export: read with its quoting
    train = write(tmp_path, "SST-2", "train.tsv",
                  lines(header, "a\t1\t0", '"first\nsecond\nthird"\t7\t1', "b\t0\t2"))
    write(tmp_path, "SST-2", "dev.tsv", lines(header, "e\t1\t0"))
    with pytest.raises(DataFormatError, match="label '7'") as info:
        load_task("sst2", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 3)  # not 5, where the record ends


@pytest.mark.parametrize("header", ["sentence\tlabel", "sentence\tlabel\tidx"])
def test_a_line_of_only_tabs_is_a_malformed_row_not_skipped(tmp_path: Path,
                                                            header: str) -> None:
    """GLUE's TSV and a Hugging Face TSV export (read with its quoting) alike: a row whose
    fields are all empty is reported at its line, never dropped without a word."""
    empty = "\t" * header.count("\t")
    first, second = ("a\t1\t0", "b\t0\t2") if "idx" in header else ("a\t1", "b\t0")
    train = write(tmp_path, "SST-2", "train.tsv", lines(header, first, empty, second))
    write(tmp_path, "SST-2", "dev.tsv", lines(header, "e\t1\t0" if "idx" in header else "e\t1"))
    with pytest.raises(DataFormatError) as info:
        load_task("sst2", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 3)


def test_a_runaway_quote_is_reported_at_the_line_it_opens(tmp_path: Path) -> None:
    header = "sentence\tlabel\tidx"
    filler = "".join(f"word{i} " * 20 + "\n" for i in range(1500))  # past csv's field limit
    train = write(tmp_path, "SST-2", "train.tsv", lines(header, "a\t1\t0") + '"open' + filler)
    write(tmp_path, "SST-2", "dev.tsv", lines(header, "e\t1\t0"))
    with pytest.raises(DataFormatError, match="not valid CSV") as info:
        load_task("sst2", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 3)


@pytest.mark.parametrize(("folder", "name", "header", "row"), [
    ("RTE", "train.tsv", "sentence1\tsentence2\tlabel\tidx",
     '"No," he said, "never."\tHe refused.\t1\t1'),
    ("RTE", "train.csv", "sentence1,sentence2,label,idx", '"No" he said,He refused.,1,1'),
])
def test_a_quote_opening_a_field_not_quoted_whole_is_refused(
        tmp_path: Path, folder: str, name: str, header: str, row: str) -> None:
    """A Hugging Face export is read with CSV quoting: a field that opens with a quote but
    is not quoted whole (the text written literally) is refused at its line, not read as
    the text without its quotes ('No, he said, "never."')."""
    sep = "\t" if name.endswith(".tsv") else ","
    first = sep.join(("A cat sat.", "An animal sat.", "0", "0"))
    train = write(tmp_path, folder, name, lines(header, first, row))
    write(tmp_path, folder, "dev.tsv", lines("sentence1\tsentence2\tlabel\tidx",
                                             "a\tb\t0\t0"))
    with pytest.raises(DataFormatError, match="not valid CSV") as info:
        load_task("rte", data_dir=tmp_path)
    assert (info.value.path, info.value.line) == (train, 3)


def test_a_parquet_shard_s_rows_are_numbered_after_a_malformed_shard(tmp_path: Path) -> None:
    def shard(first: int, texts: list[str]) -> datasets.Dataset:
        count = len(texts)
        return datasets.Dataset.from_dict(
            {"sentence1": texts, "sentence2": ["b"] * count, "label": [0] * count,
             "idx": list(range(first, first + count))},
            features=datasets.Features({
                "sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
                "idx": datasets.Value("int32")}))

    folder = tmp_path / "RTE"
    export(shard(0, ["", "a1", "a2"]), folder / "train-00000-of-00002.parquet", "parquet")
    export(shard(3, ["a3", "a4", "a5"]), folder / "train-00001-of-00002.parquet", "parquet")
    export(shard(0, ["d0"]), folder / "validation-00000-of-00001.parquet", "parquet")
    with pytest.raises(DataFormatError) as info:
        load_task("rte", data_dir=tmp_path)
    # Only the empty sentence is reported: the second shard's rows 3..5 are in place.
    assert str(info.value).splitlines() == [
        f"{folder / 'train-00000-of-00002.parquet'}: row 1: sentence1 is empty (expected text)"]
    # An unreadable shard's row count is unknown: the next shard's numbers go unchecked.
    (folder / "train-00000-of-00002.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFormatError) as info:
        load_task("rte", data_dir=tmp_path)
    assert len(str(info.value).splitlines()) == 1
    assert "not a readable parquet file" in str(info.value)


def test_a_train_cap_below_one_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "SST-2", "train.tsv", lines("sentence\tlabel", "a\t1", "b\t0", "c\t1"))
    write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel", "e\t1"))
    for cap in (0, -1):  # an empty train split is never what a cap asks for
        with pytest.raises(ValueError, match=f"max_train_examples must be >= 1, got {cap}"):
            load_task("sst2", data_dir=tmp_path, max_train_examples=cap)
    assert len(load_task("sst2", data_dir=tmp_path, max_train_examples=1).splits["train"]) == 1


@pytest.mark.parametrize(("shared", "refused"), [(100, True), (10, True), (9, False),
                                                 (49, False)])
def test_a_dev_split_copied_from_the_training_split_is_refused(tmp_path: Path, shared: int,
                                                               refused: bool) -> None:
    """A dev file cut from the training file loaded, and students were scored on rows they
    trained on. Refused once 10 or more rows, and half the split or more, are training
    rows; GLUE's own dev splits share at most 6 (the shared data's are checked elsewhere)."""
    train = [f"sentence number {index} .\t{index % 2}" for index in range(300)]
    size = 100 if shared in (100, 9) else 20 if shared == 10 else 99
    dev = train[:shared] + [f"held out {index} .\t{index % 2}" for index in range(size - shared)]
    write(tmp_path, "SST-2", "train.tsv", lines("sentence\tlabel", *train))
    dev_file = write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel", *dev))
    if not refused:
        assert len(load_task("sst2", data_dir=tmp_path).splits["dev"]) == size
        return
    with pytest.raises(DataFormatError) as info:
        load_task("sst2", data_dir=tmp_path)
    assert str(info.value) == (
        f"{dev_file}: {shared} of its {size} rows are rows of {tmp_path / 'SST-2/train.tsv'} "
        "too (the same texts and label): a dev split copied from the training split would "
        "score students on examples they trained on; use the task's own dev file")


@pytest.mark.parametrize(("rows", "scores", "refused"), [
    (40, (0, 1), True),       # RTE's export in STS-B/: labels 0 and 1, valid scores
    (19, (0, 1), False),      # too few rows to tell
    (40, (0, 1, 2.5), False),  # one real score is enough
])
def test_a_two_class_export_in_the_regression_folder_is_refused(
        tmp_path: Path, rows: int, scores: tuple[float, ...], refused: bool) -> None:
    """RTE's Hugging Face export has STS-B's columns and its labels are valid scores: it
    loaded as STS-B and trained a regressor on 0/1 targets."""
    header = "sentence1\tsentence2\tlabel\tidx"
    train = [f"premise {index} .\thypothesis {index} .\t{scores[index % len(scores)]}\t{index}"
             for index in range(rows)]
    train_file = write(tmp_path, "STS-B", "train.tsv", lines(header, *train))
    write(tmp_path, "STS-B", "validation.tsv", lines(header, *(
        f"a {index} .\tb {index} .\t{index % 6}\t{index}" for index in range(10))))
    if not refused:
        assert len(load_task("stsb", data_dir=tmp_path).splits["train"]) == rows
        return
    with pytest.raises(DataFormatError) as info:
        load_task("stsb", data_dir=tmp_path)
    assert str(info.value) == (
        f"{train_file}: all {rows} of its scores are 0 or 1, as a two-class task's labels "
        "are; STS-B's similarity scores run from 0 to 5: is this another task's export "
        "(RTE's, MRPC's and QNLI's have the same columns)? Use STS-B's own file")


def test_a_dev_row_with_another_label_is_not_a_copy(tmp_path: Path) -> None:
    train = [f"sentence number {index} .\t{index % 2}" for index in range(50)]
    relabelled = [f"sentence number {index} .\t{1 - index % 2}" for index in range(50)]
    write(tmp_path, "SST-2", "train.tsv", lines("sentence\tlabel", *train))
    write(tmp_path, "SST-2", "dev.tsv", lines("sentence\tlabel", *relabelled))
    assert len(load_task("sst2", data_dir=tmp_path).splits["dev"]) == 50
