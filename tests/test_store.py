"""Tests for harness.experiments.store (atomic JSON records) and harness.common.cache
(artifact entries, hashes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.common.cache import ArtifactCache, canonical_json, content_hash
from harness.experiments.store import ResultsStore

RUN_HASH = "0123456789abcdef" + "f" * 48


class Unprintable:
    """json.dump falls back to str() for unknown objects; this one fails there."""

    def __str__(self) -> str:
        raise RuntimeError("cannot serialise")


def files_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def sample_record(score: float = 81.5) -> dict:
    return {"run_id": RUN_HASH, "status": "finished", "main_score": score,
            "scores": {"accuracy": score}, "seeds": [1, 2], "note": "ü ✓"}


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
    assert json.loads(path.read_text(encoding="utf-8")) == record
    assert files_in(path.parent) == [path.name]


def test_find_distinguishes_hashes(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    other = "fedcba9876543210" + "0" * 48
    first = store.write(store.record_path("s", "kd", "rte", f"a-{RUN_HASH[:16]}"), {"n": 1})
    second = store.write(store.record_path("s", "ft", "mrpc", f"b-{other[:16]}"), {"n": 2})
    assert store.find(RUN_HASH) == first
    assert store.find(other) == second
    assert store.find("00" * 32) is None


def test_non_json_values_are_stringified(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "r.json", {"where": Path("/x/y")})
    assert store.load(path) == {"where": "/x/y"}


def test_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.record_path("suite", "kd", "rte", f"4L-seed1-{RUN_HASH[:16]}")
    # a long string first, so bytes reach the temporary file before the failure
    record = {"padding": "x" * 50_000, "bad": Unprintable()}
    with pytest.raises(RuntimeError, match="cannot serialise"):
        store.write(path, record)
    assert not path.exists()
    assert files_in(path.parent) == []
    assert store.find(RUN_HASH) is None
    assert list(store.records()) == []


def test_interrupted_rewrite_keeps_previous_record(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "run.json", sample_record(50.0))
    with pytest.raises(RuntimeError):
        store.write(path, {"padding": "y" * 50_000, "bad": Unprintable()})
    assert store.load(path) == sample_record(50.0)
    assert files_in(tmp_path) == ["run.json"]


def test_interrupted_write_via_failing_dump(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen_on_disk: list[tuple[str, int]] = []

    def dump_then_fail(obj, handle, **kwargs):
        handle.write('{"partial": ')
        handle.flush()
        seen_on_disk.extend((path.name, path.stat().st_size) for path in tmp_path.iterdir())
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", dump_then_fail)
    store = ResultsStore(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        store.write(tmp_path / "run.json", {"a": 1})
    # the failure came after a partial temporary file was on disk ...
    assert len(seen_on_disk) == 1
    name, size = seen_on_disk[0]
    assert name.startswith(".") and size > 0
    # ... and nothing of it remains
    assert files_in(tmp_path) == []


def test_second_write_replaces_atomically(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    path = store.write(tmp_path / "s" / "run.json", sample_record(10.0))
    with open(path, encoding="utf-8") as reader:  # a reader holding the old file
        store.write(path, sample_record(90.0))
        # a rename, not an in-place rewrite: the open handle still sees the complete old record
        assert json.loads(reader.read()) == sample_record(10.0)
    assert store.load(path) == sample_record(90.0)
    assert files_in(path.parent) == ["run.json"]


def test_records_ignore_dot_temp_files(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path)
    store.write(store.record_path("s", "kd", "rte", "one"), {"n": 1})
    store.write(store.record_path("s", "kd", "mrpc", "two"), {"n": 2})
    leftover = tmp_path / "s" / "kd" / "rte" / ".tmp-abc123.json"
    leftover.write_text('{"n": ')  # partial JSON from a killed writer
    assert sorted(record["n"] for record in store.records()) == [1, 2]


def test_records_of_empty_store(tmp_path: Path) -> None:
    assert list(ResultsStore(tmp_path / "missing").records()) == []


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
