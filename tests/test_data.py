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
            "expected at least 7",
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
    sub = load_task("mrpc", source="hub", max_train_examples=2)
    assert column(sub.splits["train"], "idx") == sorted(
        np.random.default_rng(0).permutation(5)[:2].tolist()
    )
    assert sub.fingerprint != load_task("mrpc", source="hub").fingerprint


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
