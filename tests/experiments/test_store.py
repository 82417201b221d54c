"""Tests for harness.experiments.store (validated run records, written atomically) and
harness.common.cache (artifact entries, hashes)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from harness.common.cache import ArtifactCache, canonical_json, content_hash
from harness.common.files import write_json_atomic
from harness.experiments.record import RunRecord
from harness.experiments.store import InvalidRecordError, ResultsStore
from tests.records import run_record


class Unprintable:
    """json.dump falls back to str() for unknown objects; this one fails there."""

    def __str__(self) -> str:
        raise RuntimeError("cannot serialise")


def files_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def sample_record(score: float = 81.5, run: str = "sample") -> RunRecord:
    """A run of kd on RTE: the same ``run`` is the same run id, whatever the score."""
    return run_record(run=run, main_score=score, method="kd", task="rte",
                      machine={"note": "ü ✓"})


RUN_HASH = sample_record().run_id


# --------------------------------------------------------------------------- ResultsStore


def test_record_path_layout(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.record_path("glue-cpu", "kd", "rte", "4L-seed1-abc")
    assert path == tmp_path / "glue-cpu" / "kd" / "rte" / "4L-seed1-abc.json"


def test_write_find_load_round_trip(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    assert store.find(RUN_HASH) is None
    path = store.record_path("suite", "kd", "rte", f"4L-seed1-{RUN_HASH[:16]}")
    record = sample_record()
    assert store.write(path, record) == path
    assert path.is_file()
    found = store.find(RUN_HASH)
    assert found == path
    assert store.load(found) == record
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert on_disk["main_score"] == 81.5 and on_disk["machine"]["note"] == "ü ✓"
    assert "error" not in on_disk  # a field no one set is left out ...
    zero = run_record(pct_of_teacher=None, teacher_main_score=0.0)
    assert zero.document()["pct_of_teacher"] is None  # ... an explicit None stays
    assert files_in(path.parent) == [path.name]


def test_find_distinguishes_hashes(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    other = sample_record(2.0, run="other")
    first = store.write(store.record_path("s", "kd", "rte", f"a-{RUN_HASH[:16]}"),
                        sample_record(1.0))
    second = store.write(store.record_path("s", "ft", "mrpc", f"b-{other.run_id[:16]}"),
                         other)
    other = other.run_id
    assert store.find(RUN_HASH) == first
    assert store.find(other) == second
    assert store.find("00" * 32) is None


def test_a_record_whose_configuration_was_edited_is_refused_naming_its_file(
        tmp_path: Path) -> None:
    """The run id is the hash of the resolved configuration: a record whose configuration
    was edited after the run (a weight, the student, the task) would put its score in the
    row of a configuration that never produced it, so it does not load."""
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "s" / "kd" / "rte" / "run.json", sample_record(50.0))
    document = json.loads(path.read_text())
    assert store.load(path).main_score == 50.0
    document["config"]["params"] = {"alpha": 0.9}
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidRecordError,
                       match=r"run\.json: .*run id \w{16} is not the hash of its config"):
        store.load(path)
    # Moved into another row, the configuration rehashed: the fields disagree with it.
    document = sample_record(50.0).document()
    document["task"], document["task_display"] = "mrpc", "MRPC"
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidRecordError, match=r"it says task 'mrpc', its config 'rte'"):
        store.load(path)
    document = sample_record(50.0).document()
    document["config_hash"] = "0" * 64
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidRecordError, match="config_hash 0000000000000000 differs"):
        store.load(path)


def test_a_record_that_disagrees_with_its_configuration_says_so_in_plain_words(
        tmp_path: Path) -> None:
    """The check spans the whole record, so pydantic gives it no field and prefixes its
    "Value error, ": the message is the check's own, after the file it names."""
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "run.json", sample_record(50.0))
    document = json.loads(path.read_text())
    document["seed"] = 5
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidRecordError) as refused:
        store.load(path)
    assert str(refused.value) == (f"{path}: not a valid run record: it says seed 5, its "
                                  "config 1")


def test_a_record_is_checked_when_built_and_when_read(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="main_scor"):
        RunRecord.model_validate({**sample_record().document(), "main_scor": 1.0})
    with pytest.raises(ValidationError, match="status"):
        run_record(status="done")
    store = ResultsStore(tmp_path)
    path = tmp_path / "s" / "kd" / "rte" / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**sample_record().document(), "seed": "one"}))
    with pytest.raises(InvalidRecordError,
                       match=r"run\.json: not a valid run record: seed: Input should be"):
        store.load(path)
    path.write_text('{"run_id": ')  # not JSON at all
    with pytest.raises(InvalidRecordError, match=r"run\.json"):
        list(store.records())
    path.unlink()
    path.mkdir()  # a folder named like a record: it stopped a table with a traceback
    with pytest.raises(InvalidRecordError, match=r"run\.json: cannot read it as a run record"):
        list(store.records())


def test_every_committed_record_is_a_valid_run_record() -> None:
    results = Path(__file__).resolve().parents[2] / "results"
    paths = [path for path in results.glob("*/**/*.json")
             if path.relative_to(results).parts[0] != "bench"]
    assert paths, "no committed records"
    for path in paths:
        record = ResultsStore(results).load(path)
        assert path.stem.endswith(record.run_id[:16])


def test_atomic_write_of_an_unserialisable_document_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "suite" / "run.json"
    with pytest.raises(RuntimeError, match="cannot serialise"):
        write_json_atomic(path, {"bad": Unprintable()})
    assert not path.parent.exists()


def test_interrupted_rewrite_keeps_previous_record(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "run.json", sample_record(50.0))
    with pytest.raises(RuntimeError):
        write_json_atomic(path, {"bad": Unprintable()})
    assert store.load(path) == sample_record(50.0)
    assert files_in(tmp_path) == ["run.json"]


def test_interrupted_write_via_failing_sync(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.common import files

    seen_on_disk: list[tuple[str, int]] = []

    def sync_fails(descriptor: int) -> None:  # the record's bytes are written, then the disk fills
        seen_on_disk.extend((path.name, path.stat().st_size) for path in tmp_path.iterdir())
        raise OSError("disk full")

    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "run.json", sample_record(50.0))
    monkeypatch.setattr(files.os, "fsync", sync_fails)
    with pytest.raises(OSError, match="disk full"):
        store.write(path, sample_record(90.0))
    monkeypatch.undo()
    # the failure came after a temporary file was on disk ...
    assert len(seen_on_disk) == 2
    assert any(name.startswith(".") and size > 0 for name, size in seen_on_disk)
    # ... and nothing of it remains: the previous record is intact
    assert files_in(tmp_path) == ["run.json"]
    assert store.load(path) == sample_record(50.0)


def test_second_write_replaces_atomically(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "s" / "run.json", sample_record(10.0))
    with open(path, encoding="utf-8") as reader:  # a reader holding the old file
        store.write(path, sample_record(90.0))
        # a rename, not an in-place rewrite: the open handle still sees the complete old record
        assert json.loads(reader.read())["main_score"] == 10.0
    assert store.load(path) == sample_record(90.0)
    assert files_in(path.parent) == ["run.json"]


def test_records_ignore_dot_temp_files(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    store.write(store.record_path("s", "kd", "rte", "one"), sample_record(1.0))
    store.write(store.record_path("s", "kd", "mrpc", "two"),
                sample_record(2.0, run="two"))
    leftover = tmp_path / "s" / "kd" / "rte" / ".tmp-abc123.json"
    leftover.write_text('{"n": ')  # partial JSON from a killed writer
    assert sorted(record.main_score for record in store.records()) == [1.0, 2.0]


def test_a_second_record_of_one_run_is_left_out_and_named(tmp_path: Path) -> None:
    """A copy kept beside a record (or a store merged into another) must not count the run
    twice in a mean; the copy is named."""
    from harness.experiments.suites import load_suite
    from harness.reporting.tables import finished_records

    suite = load_suite("glue-cpu")
    store = ResultsStore(tmp_path)
    for seed, score in ((1, 80.0), (2, 84.0)):
        store.write(store.record_path(suite.record_suite, "kd", "mrpc", f"seed{seed}"),
                    run_record(seed=seed, main_score=score))
    first = tmp_path / suite.record_suite / "kd" / "mrpc" / "seed1.json"
    copy = first.with_name("seed1-copy.json")
    copy.write_bytes(first.read_bytes())
    logs: list[str] = []
    runs = finished_records(suite, tmp_path, logs.append)
    assert sorted(runs["score"]) == [80.0, 84.0] and runs["score"].mean() == 82.0
    named = [line for line in logs if str(copy) in line]  # the rest: stubs, not glue-cpu's
    assert len(named) == 1 and str(first) in named[0]
    assert f"a second record of run {run_record(seed=1).run_id[:16]}" in named[0]
    with pytest.warns(UserWarning, match="a second record of run"):
        assert len(list(store.records())) == 2


def test_a_trial_run_as_a_grid_cell_is_one_run_and_not_a_warning(tmp_path: Path) -> None:
    """A tuning trial whose parameters are the recipe's is the cell's run in the nested
    store: the root's records hold it once, the cell's record, and say nothing."""
    import warnings

    store = ResultsStore(tmp_path)
    cell = store.record_path("zeta", "kd", "mrpc", "seed1")
    trial = ResultsStore(tmp_path / "tuning" / "study").record_path("zeta", "kd", "mrpc",
                                                                    "seed1")
    store.write(cell, run_record(run="cell", main_score=80.0))
    store.write(trial, run_record(run="cell", main_score=80.0, tuned={"study": "study"}))
    assert trial < cell  # the trial comes first in path order, and still the cell counts
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = list(store.records())
    assert len(records) == 1 and records[0].tuned is None


def test_records_of_a_results_root_leave_bench_records_out(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    store.write(store.record_path("s", "kd", "rte", "one"), sample_record(1.0))
    write_json_atomic(tmp_path / "bench" / "s" / "host-cpu.json", {"kind": "bench"})
    assert [record.main_score for record in store.records()] == [1.0]


def test_records_of_empty_store(tmp_path: Path) -> None:
    assert list(ResultsStore(tmp_path / "missing").records()) == []


def test_label_marks_runs_off_their_recipe() -> None:
    assert run_record().label() == "kd"
    assert run_record(tuned={"study": "x"}).label() == "kd [tuned]"
    assert run_record(variation={"student": "wide", "task_epochs": 1.0}).label() \
        == "kd [wide, grid budget]"


# --------------------------------------------------------------------------- ArtifactCache


def test_successful_build_creates_entry(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    key = content_hash({"task": "rte"})
    assert not cache.has("teachers", key)
    with cache.build("teachers", key, {"task": "rte", "where": Path("/a")}) as scratch:
        assert scratch.parent == tmp_path / "teachers"
        assert scratch != cache.path("teachers", key)
        (scratch / "weights.bin").write_bytes(b"\x00\x01")
        assert not cache.has("teachers", key)  # not visible until the block ends
    entry = cache.path("teachers", key)
    assert cache.has("teachers", key)
    assert (entry / "weights.bin").read_bytes() == b"\x00\x01"
    description = json.loads((entry / "key.json").read_text())
    assert description["key"] == key
    assert description["task"] == "rte"
    assert description["where"] == "/a"
    assert "cache_version" in description
    assert files_in(tmp_path / "teachers") == [key]  # no scratch dir left


def test_failed_build_leaves_no_entry(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    key = content_hash({"task": "mrpc"})
    with (pytest.raises(RuntimeError, match="training crashed"),
          cache.build("teachers", key, {}) as scratch):
        (scratch / "half.bin").write_bytes(b"partial")
        raise RuntimeError("training crashed")
    assert not cache.has("teachers", key)
    assert not cache.path("teachers", key).exists()
    assert files_in(tmp_path / "teachers") == []


def test_build_replaces_incomplete_leftover(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    key = content_hash({"task": "sst2"})
    leftover = cache.path("teachers", key)
    leftover.mkdir(parents=True)
    (leftover / "stale.bin").write_bytes(b"old")
    assert not cache.has("teachers", key)  # no COMPLETE marker
    with cache.build("teachers", key, {}) as scratch:
        (scratch / "fresh.bin").write_bytes(b"new")
    assert cache.has("teachers", key)
    assert sorted(files_in(leftover)) == ["COMPLETE", "fresh.bin", "key.json"]


def test_failed_rebuild_keeps_existing_entry(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    key = content_hash({"task": "cola"})
    with cache.build("logits", key, {}) as scratch:
        (scratch / "v1").write_text("one")
    with pytest.raises(ValueError, match="boom"), cache.build("logits", key, {}) as scratch:
        (scratch / "v2").write_text("two")
        raise ValueError("boom")
    assert cache.has("logits", key)
    assert (cache.path("logits", key) / "v1").read_text() == "one"
    assert files_in(tmp_path / "logits") == [key]


# --------------------------------------------------------------------------- content_hash


def test_content_hash_ignores_key_order() -> None:
    first = {"task": "rte", "lr": 1e-4, "nested": {"a": 1, "b": [1, 2]}}
    second = {"nested": {"b": [1, 2], "a": 1}, "lr": 1e-4, "task": "rte"}
    assert content_hash(first) == content_hash(second)
    assert canonical_json(first) == canonical_json(second)


@pytest.mark.parametrize("changed", [
    {"task": "mrpc", "lr": 1e-4, "nested": {"a": 1, "b": [1, 2]}},
    {"task": "rte", "lr": 2e-4, "nested": {"a": 1, "b": [1, 2]}},
    {"task": "rte", "lr": 1e-4, "nested": {"a": 1, "b": [2, 1]}},
    {"task": "rte", "lr": 1e-4, "nested": {"a": "1", "b": [1, 2]}},
    {"task": "rte", "lr": 1e-4, "nested": {"a": 1, "b": [1, 2]}, "extra": None},
])
def test_content_hash_differs_for_different_values(changed: dict) -> None:
    base = {"task": "rte", "lr": 1e-4, "nested": {"a": 1, "b": [1, 2]}}
    assert content_hash(changed) != content_hash(base)


def test_content_hash_is_sha256_hex() -> None:
    digest = content_hash({"x": 1})
    assert len(digest) == 64
    int(digest, 16)


# --------------------------------------------------------------------------- damaged entries


def built_entry(cache: ArtifactCache, key: str) -> Path:
    with cache.build("teachers", key, {"task": "rte"}) as scratch:
        (scratch / "weights.bin").write_bytes(bytes(range(256)) * 4)
        (scratch / "logits").mkdir()
        np.save(scratch / "logits" / "train.npy", np.linspace(-1, 1, 20, dtype=np.float32))
    return cache.path("teachers", key)


def edited_manifest(change):
    """A damage: ``key.json``'s files record edited by hand (``change`` maps it to the new
    record)."""
    def damage(entry: Path) -> None:
        description = json.loads((entry / "key.json").read_text())
        description["files"] = change(description["files"])
        (entry / "key.json").write_text(json.dumps(description))
    return damage


@pytest.mark.parametrize(("damage", "problem"), [
    (edited_manifest(lambda files: sorted(files)), "key.json unreadable (its files record"),
    (edited_manifest(lambda files: {name: {"size": item["size"]}
                                    for name, item in files.items()}),
     "key.json unreadable (its files record"),
    (lambda entry: (entry / "weights.bin").write_bytes(bytes(range(256)) * 2),
     "weights.bin has 512 bytes, 1024 were written"),
    (lambda entry: (entry / "logits" / "train.npy").unlink(), "logits/train.npy is missing"),
    (lambda entry: (entry / "weights.bin").write_bytes(bytes(range(255, -1, -1)) * 4),
     "weights.bin was altered"),
    (lambda entry: (entry / "key.json").write_text("{"), "key.json unreadable"),
])
def test_a_damaged_entry_is_reported_discarded_and_rebuilt(tmp_path: Path, damage,
                                                           problem: str) -> None:
    key = content_hash({"task": "rte", "damage": problem})
    entry = built_entry(ArtifactCache(tmp_path), key)
    manifest = json.loads((entry / "key.json").read_text())["files"]
    assert manifest["weights.bin"]["size"] == 1024 and "logits/train.npy" in manifest
    damage(entry)
    messages: list[str] = []
    cache = ArtifactCache(tmp_path, log=messages.append)  # a later process
    assert not cache.has("teachers", key)
    assert problem in messages[0] and "rebuilding it" in messages[0]
    assert not entry.exists() and files_in(tmp_path / "teachers") == []
    built_entry(cache, key)
    assert cache.has("teachers", key)
    assert ArtifactCache(tmp_path, log=messages.append).has("teachers", key)
    assert len(messages) == 1


def test_an_entry_of_another_key_moved_under_this_one_is_not_used(tmp_path: Path) -> None:
    """Every file whole and matching its checksum, but the entry of another key (another
    teacher seed, another task with as many rows): copied in by hand or by a sync of
    caches, it would serve another teacher's logits under this key."""
    import shutil

    key, other = content_hash({"task": "rte", "seed": 0}), content_hash({"task": "rte", "seed": 1})
    cache = ArtifactCache(tmp_path)
    entry = built_entry(cache, key)
    with cache.build("teachers", other, {"task": "rte"}) as scratch:
        (scratch / "weights.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
        (scratch / "logits").mkdir()
        np.save(scratch / "logits" / "train.npy", np.linspace(1, -1, 20, dtype=np.float32))
    shutil.rmtree(entry)
    shutil.copytree(cache.path("teachers", other), entry)
    messages: list[str] = []
    later = ArtifactCache(tmp_path, log=messages.append)
    assert not later.has("teachers", key)
    assert f"another key ({other[:16]})" in messages[0] and "rebuilding it" in messages[0]
    assert not entry.exists() and later.has("teachers", other)


def _source(cache: ArtifactCache, key: str, weights: bytes) -> None:
    with cache.build("teachers", key, {"task": "rte"}) as scratch:
        (scratch / "weights.bin").write_bytes(weights)


def test_an_entry_made_from_a_source_rebuilt_with_other_contents_is_rebuilt(
        tmp_path: Path) -> None:
    """Teacher outputs (a bf16 labelling, intermediate arrays, logits on augmented copies)
    are keyed by the teacher's key, not its weights: a teacher entry damaged and fine-tuned
    again (on another thread count: other weights) left them in place, and a student read
    outputs of the old teacher beside the new one's logits."""
    teacher, outputs = content_hash({"teacher": 1}), content_hash({"outputs": 1})
    cache = ArtifactCache(tmp_path)
    _source(cache, teacher, b"weights of the first build")
    with cache.build("intermediates", outputs, {}, made_from=[("teachers", teacher)]) as scratch:
        np.save(scratch / "values.npy", np.arange(4, dtype=np.float16))
    assert ArtifactCache(tmp_path).has("intermediates", outputs)
    shutil.rmtree(cache.path("teachers", teacher))  # rebuilt with the same contents: kept
    _source(ArtifactCache(tmp_path), teacher, b"weights of the first build")
    assert ArtifactCache(tmp_path).has("intermediates", outputs)
    shutil.rmtree(cache.path("teachers", teacher))  # rebuilt with other weights: not kept
    _source(ArtifactCache(tmp_path), teacher, b"weights of another build")
    messages: list[str] = []
    later = ArtifactCache(tmp_path, log=messages.append)
    assert not later.has("intermediates", outputs)
    assert messages == [f"[cache] intermediates/{outputs[:16]} is damaged (it was made from "
                        f"another build of teachers/{teacher[:16]}); rebuilding it"]
    assert later.has("teachers", teacher)


def test_an_entry_written_before_checksums_has_them_recorded(tmp_path: Path) -> None:
    key = content_hash({"task": "old"})
    entry = built_entry(ArtifactCache(tmp_path), key)
    description = json.loads((entry / "key.json").read_text())
    del description["files"], description["entry_format"]  # as written before checksums
    (entry / "key.json").write_text(json.dumps(description))
    messages: list[str] = []
    assert ArtifactCache(tmp_path, log=messages.append).has("teachers", key)
    assert "recorded them now" in messages[0]
    assert "weights.bin" in json.loads((entry / "key.json").read_text())["files"]
    (entry / "weights.bin").write_bytes(b"x" * 1024)
    assert not ArtifactCache(tmp_path, log=messages.append).has("teachers", key)


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda path: np.save(path, np.full(20, np.nan, dtype=np.float32)),
     "logits/train.npy holds non-finite numbers"),
    (lambda path: path.write_bytes(path.read_bytes()[:-8]), "logits/train.npy unreadable"),
])
def test_an_entry_without_checksums_is_read_before_they_are_recorded(
        tmp_path: Path, damage, problem: str) -> None:
    """An old entry's checksums would seal whatever it holds: its files are read first,
    and one that is damaged is rebuilt rather than trusted."""
    key = content_hash({"task": "old", "damage": problem})
    entry = built_entry(ArtifactCache(tmp_path), key)
    description = json.loads((entry / "key.json").read_text())
    del description["files"], description["entry_format"]  # as written before checksums
    (entry / "key.json").write_text(json.dumps(description))
    damage(entry / "logits" / "train.npy")
    messages: list[str] = []
    assert not ArtifactCache(tmp_path, log=messages.append).has("teachers", key)
    assert problem in messages[0] and "rebuilding it" in messages[0]
    assert not entry.exists()


def _write_weights(kind: str, path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {"weight": torch.linspace(-1, 1, 4096).reshape(64, 64)}
    if kind == "safetensors":
        save_file(tensors, path)
    elif kind == "pt":
        torch.save(tensors, path)


@pytest.mark.parametrize("kind", ["safetensors", "pt"])
def test_an_old_entry_whose_weights_are_cut_short_is_rebuilt(tmp_path: Path, kind: str
                                                             ) -> None:
    """A general checkpoint's body (.pt) or a teacher's weights (.safetensors) cut short
    in an entry without checksums: rebuilt, not sealed."""
    key = content_hash({"task": "old", "kind": kind})
    cache = ArtifactCache(tmp_path)
    with cache.build("general", key, {"task": "rte"}) as scratch:
        _write_weights(kind, scratch / f"body.{kind}")
    entry = cache.path("general", key)
    description = json.loads((entry / "key.json").read_text())
    del description["files"], description["entry_format"]  # as written before checksums
    (entry / "key.json").write_text(json.dumps(description))
    intact: list[str] = []
    assert ArtifactCache(tmp_path, log=intact.append).has("general", key)  # sealed: whole
    assert "recorded them now" in intact[0]
    (entry / "key.json").write_text(json.dumps(description))  # old again, then damaged
    body = entry / f"body.{kind}"
    body.write_bytes(body.read_bytes()[:len(body.read_bytes()) // 2 + 3])
    messages: list[str] = []
    assert not ArtifactCache(tmp_path, log=messages.append).has("general", key)
    assert f"body.{kind} unreadable" in messages[0] and "rebuilding it" in messages[0]
    assert not entry.exists()


def test_an_old_entry_of_json_lines_is_rebuilt_even_when_every_line_parses(
        tmp_path: Path) -> None:
    """Augmented copies or POS tags (JSON lines) in an entry without checksums: a file cut
    at a line's end parses line by line, so such an entry is rebuilt, never sealed."""
    key = content_hash({"task": "old", "kind": "jsonl"})
    cache = ArtifactCache(tmp_path)
    with cache.build("augmented", key, {"task": "rte"}) as scratch:
        (scratch / "examples.jsonl").write_text("".join(
            json.dumps({"source_row": row, "fields": [f"copy {row}"]}) + "\n"
            for row in range(50)))
    entry = cache.path("augmented", key)
    description = json.loads((entry / "key.json").read_text())
    del description["files"], description["entry_format"]  # as written before checksums
    (entry / "key.json").write_text(json.dumps(description))
    copies = entry / "examples.jsonl"
    copies.write_text("".join(copies.read_text().splitlines(keepends=True)[:30]))
    messages: list[str] = []
    assert not ArtifactCache(tmp_path, log=messages.append).has("augmented", key)
    assert "examples.jsonl holds JSON lines written before checksums" in messages[0]
    assert "rebuilding it" in messages[0] and not entry.exists()


@pytest.mark.parametrize("bad_index", [None, 0, 6, 7, 59])
def test_old_entries_arrays_are_checked_for_non_finite_numbers_block_by_block(
        tmp_path: Path, bad_index: int | None) -> None:
    """The check reads a memory-mapped array in blocks (no mask the array's size): a NaN
    in any block, the first and last included, is found."""
    from harness.common.cache import _all_finite

    values = np.arange(60, dtype=np.float16).reshape(6, 10)
    if bad_index is not None:
        values.reshape(-1)[bad_index] = np.inf if bad_index % 2 else np.nan
    np.save(tmp_path / "a.npy", values)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert _all_finite(mapped, block=7) is (bad_index is None)


class FullDisk:
    """A value whose serialisation fails part-way, as a write on a full disk does."""

    def __str__(self) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_part_way_leaves_the_previous_file(tmp_path: Path) -> None:
    from harness.common.files import write_json_atomic

    path = tmp_path / "record.json"
    write_json_atomic(path, {"score": 1.0})
    with pytest.raises(OSError, match="No space left"):
        write_json_atomic(path, {"score": 2.0, "padding": "x" * 100_000, "late": FullDisk()})
    assert json.loads(path.read_text()) == {"score": 1.0}
    assert [item.name for item in tmp_path.iterdir()] == ["record.json"]  # no partial file


def test_a_cache_entry_that_fails_part_way_leaves_the_previous_entry(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    key = content_hash({"task": "full"})
    entry = built_entry(cache, key)
    before = json.loads((entry / "key.json").read_text())["files"]
    with pytest.raises(OSError, match="No space left"), \
            cache.build("teachers", key, {}) as scratch:
        (scratch / "weights.bin").write_bytes(b"\x00" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")
    assert ArtifactCache(tmp_path).has("teachers", key)
    assert json.loads((entry / "key.json").read_text())["files"] == before
    assert files_in(tmp_path / "teachers") == [key]


def test_a_second_process_waits_for_an_entry_being_made_and_does_not_make_it_again(
        tmp_path: Path) -> None:
    """Two grid workers that need the same teacher or general checkpoint: the first makes
    it, the second waits for it (saying so) and then finds it made, instead of spending the
    same hour a second time."""
    import threading

    first_log: list[str] = []
    second_log: list[str] = []
    first = ArtifactCache(tmp_path, log=first_log.append)
    second = ArtifactCache(tmp_path, log=second_log.append)
    made: list[str] = []
    first_holds, second_done = threading.Event(), threading.Event()

    def make(cache: ArtifactCache, name: str, hold: threading.Event | None) -> None:
        with cache.producing("general", "k" * 64):
            if hold is not None:
                hold.set()
                # Released only once the second process is seen waiting.
                for _ in range(500):
                    if second_log:
                        break
                    threading.Event().wait(0.01)
            if not cache.has("general", "k" * 64):
                with cache.build("general", "k" * 64, {"by": name}) as scratch:
                    (scratch / "body.pt").write_text(name)
                made.append(name)

    one = threading.Thread(target=make, args=(first, "first", first_holds))
    one.start()
    first_holds.wait(5)
    two = threading.Thread(target=lambda: (make(second, "second", None), second_done.set()))
    two.start()
    one.join(10)
    two.join(10)
    assert second_done.is_set()
    assert made == ["first"]
    assert second_log and "is being made by another process; waiting for it" in second_log[0]
    assert (tmp_path / "general" / ("k" * 64) / "body.pt").read_text() == "first"
    # Within one distributed launch every process makes the entry together: nobody waits.
    with first.producing("general", "k" * 64), \
            second.producing("general", "k" * 64, exclusive=False):
        pass


@pytest.mark.e2e
def test_a_cache_folder_that_is_a_file_and_a_misspelt_task_are_named_up_front(tmp_path):
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.common.cache import ArtifactCache, CacheNotUsableError

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(CacheNotUsableError, match="is a file: pass a folder as --cache-dir"):
        ArtifactCache(a_file)
    done = CliRunner().invoke(app, ["run", "--suite", "glue-cpu", "-m", "kd", "--tasks", "rte",
                                    "--seeds", "1", "--results", str(tmp_path / "r"),
                                    "--cache-dir", str(a_file)])
    assert done.exit_code == 2 and "is a file: pass a folder as --cache-dir" in done.output
    fetch = CliRunner().invoke(app, ["data", "fetch", "--out", str(tmp_path / "glue"),
                                     "--tasks", "mrpc,foo"])
    assert fetch.exit_code == 2 and "unknown task 'foo'" in fetch.output
    assert "internet" not in fetch.output
