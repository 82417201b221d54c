"""A full disk loses no trained result and no report: a run that cannot fit stops before it
trains, a record the disk refuses after training is kept in a recovery copy that the next
start stores without training, and a report write that fails leaves the previous files
whole.  Each case runs on a real full filesystem (a small tmpfs, where this machine lets
the tests mount one: as root) and with the write failure injected (everywhere)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification
from typer.testing import CliRunner

from harness.cli import app
from harness.experiments.record import RunRecord
from harness.experiments.runner import SuiteRunner
from harness.experiments.space import ENTRY_BYTES, WEIGHT_BYTES, space_needed
from harness.experiments.store import RECORD_BYTES, ResultsStore
from harness.experiments.suites import load_suite
from tests.records import run_record
from tests.reporting.test_report import SCORES, write_record

NO_SPACE = os.strerror(errno.ENOSPC)
WAYS = ["tmpfs", "injected"]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """Mounts a tmpfs of a given size at ``tmp_path/<name>`` (unmounted after the test);
    the test is skipped where none can be mounted (not root, no mount command)."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root and the mount command")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """Write zeros into ``folder/filler`` until its filesystem has no byte left."""
    filler = folder / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(descriptor, bytes(1 << 16))
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(descriptor)
    return filler


def refuse_under(monkeypatch: pytest.MonkeyPatch, *roots: Path, full: bool = True
                 ) -> Callable[[bool], None]:
    """Every atomic write whose target lies under one of ``roots`` fails as on a full disk
    (its temporary file written, its rename refused) while the disk is ``full``.  Returns
    what fills the disk (True) or makes room again (False)."""
    replace = os.replace
    state = [full]

    def refusing(source, target, *args, **kwargs):
        if state[0] and any(Path(target).is_relative_to(root) for root in roots):
            raise OSError(errno.ENOSPC, NO_SPACE)
        return replace(source, target, *args, **kwargs)

    def set_full(value: bool) -> None:
        state[0] = value

    monkeypatch.setattr(os, "replace", refusing)
    return set_full


@pytest.fixture
def trainings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks of the runs that trained (``SuiteRunner._train`` calls), in order."""
    calls: list[str] = []
    train = SuiteRunner._train

    def counted(self, plan, *args, **kwargs):
        calls.append(plan.task.name)
        return train(self, plan, *args, **kwargs)

    monkeypatch.setattr(SuiteRunner, "_train", counted)
    return calls


def run_command(suite_file: Path, results: Path, cache: Path) -> list[str]:
    return ["run", "--suite", str(suite_file), "--method", "kd", "--tasks", "rte",
            "--results", str(results), "--cache-dir", str(cache)]


def fail_after_training(monkeypatch: pytest.MonkeyPatch, way: str, disk: Path,
                        *roots: Path) -> Callable[[], None]:
    """Make the record write of the next run fail: once the run has trained, fill the
    tmpfs ``disk``, or refuse the writes under ``roots``.  Returns what makes room again."""
    set_full = refuse_under(monkeypatch, *roots, full=False) if way == "injected" else None
    train = SuiteRunner._train

    def then_fill(self, *args, **kwargs):
        outcome = train(self, *args, **kwargs)
        if set_full is None:
            fill(disk)
        else:
            set_full(True)
        return outcome

    monkeypatch.setattr(SuiteRunner, "_train", then_fill)
    if set_full is None:
        return (disk / "filler").unlink
    return lambda: set_full(False)


def no_partial_files(*folders: Path) -> bool:
    return not [path for folder in folders for path in folder.rglob(".tmp-*")]


@pytest.mark.e2e
def test_the_atomic_writers_leave_the_previous_file_when_the_write_fails(
        tmp_path, tmpfs, monkeypatch):
    from harness.common.files import atomic_path, write_bytes_atomic, write_text_atomic

    disk = tmpfs("disk", "64k")
    target = write_text_atomic(disk / "a.md", "previous\n")
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    fill(disk)
    with pytest.raises(OSError, match=NO_SPACE):
        write_bytes_atomic(target, b"x" * 100_000)
    with pytest.raises(OSError, match=NO_SPACE), atomic_path(target) as temporary:
        temporary.write_bytes(b"y" * 100_000)
    assert target.read_text() == "previous\n" and no_partial_files(disk)


@pytest.mark.e2e
@pytest.mark.parametrize("way", WAYS)
def test_a_record_the_disk_refuses_is_kept_and_the_next_start_stores_it_without_training(
        way, tiny_suite_file, tmp_path, tmpfs, trainings, monkeypatch):
    disk = tmpfs("store", "4m") if way == "tmpfs" else tmp_path / "store"
    results, cache = disk / "results", tmp_path / "cache"
    make_room = fail_after_training(monkeypatch, way, disk, results)
    command = run_command(tiny_suite_file, results, cache)

    failed = CliRunner().invoke(app, command)
    assert failed.exit_code == 2, failed.output
    assert trainings == ["rte"] and "Traceback" not in failed.output
    error = failed.output.strip().splitlines()[-1]
    kept = re.fullmatch(
        rf"error: {re.escape(str(results))}/tiny/kd/rte/tiny-seed1-([0-9a-f]{{16}})\.json: "
        rf"the run's record could not be written \({NO_SPACE}\); its dev accuracy is "
        rf"[0-9.]+; it is kept in ({re.escape(str(cache))}/recovered/\1[0-9a-f]{{48}}\.json)"
        ": make room and run the same command again, which stores it without training",
        error)
    assert kept is not None, error
    copy = Path(kept.group(2))
    saved = copy.read_bytes()
    record = RunRecord.model_validate_json(saved)
    assert record.finished and record.run_id == copy.stem
    assert not list(results.rglob("*.json")) and no_partial_files(results, cache)

    make_room()
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0, again.output
    assert trainings == ["rte"]  # not trained again
    stored = results / "tiny" / "kd" / "rte" / f"tiny-seed1-{record.run_id[:16]}.json"
    assert (f"[recovered] kd rte seed 1: the record kept in {copy} when it could not be "
            f"written is now in the store at {stored}; not trained again") in again.output
    assert "[run]" not in again.output
    assert stored.read_bytes() == saved and not copy.exists()
    third = CliRunner().invoke(app, command)
    assert third.exit_code == 0 and "[skip] kd rte seed 1: already recorded" in third.output
    assert trainings == ["rte"]


@pytest.mark.e2e
@pytest.mark.parametrize("way", WAYS)
def test_a_record_is_kept_in_the_temp_folder_when_the_cache_is_on_the_full_disk_too(
        way, tiny_suite_file, tmp_path, tmpfs, trainings, monkeypatch):
    disk = tmpfs("disk", "32m") if way == "tmpfs" else tmp_path / "disk"
    results, cache = disk / "results", disk / "cache"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    make_room = fail_after_training(monkeypatch, way, disk, results, cache)
    command = run_command(tiny_suite_file, results, cache)

    failed = CliRunner().invoke(app, command)
    assert failed.exit_code == 2 and trainings == ["rte"], failed.output
    folder = tmp_path / "tmp" / f"distill-bench-recovered-{os.getuid()}"
    copies = list(folder.glob("*.json"))
    assert len(copies) == 1 and f"it is kept in {copies[0]}: " in failed.output
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert not (cache / "recovered").exists() or not list((cache / "recovered").iterdir())

    make_room()
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0 and trainings == ["rte"], again.output
    assert f"[recovered] kd rte seed 1: the record kept in {copies[0]}" in again.output
    assert not copies[0].exists() and len(list(results.rglob("*.json"))) == 1


@pytest.mark.e2e
def test_a_recovery_copy_that_is_not_the_runs_record_is_named_not_stored(
        tiny_suite_file, tmp_path, trainings, monkeypatch):
    results, cache = tmp_path / "results", tmp_path / "cache"
    command = run_command(tiny_suite_file, results, cache)
    set_full = refuse_under(monkeypatch, results)
    assert CliRunner().invoke(app, command).exit_code == 2
    set_full(False)
    copy = next((cache / "recovered").glob("*.json"))
    for text, problem in ((json.dumps(run_record().document()), "a recovery copy of run "),
                          ("{\"status\": \"fin", "not a valid run record: ")):
        copy.write_text(text)  # another run's record under this run's name; a damaged one
        refused = CliRunner().invoke(app, command)
        assert refused.exit_code == 2 and "Traceback" not in refused.output
        assert refused.output.strip().splitlines()[-1].startswith(
            f"error: {copy}: {problem}"), refused.output
        assert copy.read_text() == text and not list(results.rglob("*.json"))
    assert trainings == ["rte"]


def tiny_teacher_parameters(teacher_dir: Path) -> int:
    model = AutoModelForSequenceClassification.from_pretrained(teacher_dir, num_labels=2)
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.e2e
@pytest.mark.parametrize("way", WAYS)
def test_a_run_that_cannot_fit_stops_before_its_teacher_or_training(
        way, tiny_suite_file, tiny_teacher_dir, tmp_path, tmpfs, trainings, monkeypatch):
    teacher = WEIGHT_BYTES * tiny_teacher_parameters(tiny_teacher_dir) + ENTRY_BYTES
    if way == "tmpfs":  # a store without room for a record; then a cache without a teacher's
        small, cache_disk = tmpfs("small", "512k"), tmpfs("cache", "8m")
        cases = [(small / "results", tmp_path / "cache", small / "results/tiny/kd/rte",
                  f"the run needs about {RECORD_BYTES:,} (its record {RECORD_BYTES:,})"),
                 (tmp_path / "results", cache_disk, cache_disk,
                  f"the run needs about {teacher:,} (the rte teacher {teacher:,})")]
    else:  # one disk with a byte less than the record and the teacher need
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(
            free=RECORD_BYTES + teacher - 1))
        results = tmp_path / "results"
        cases = [(results, tmp_path / "cache", results / "tiny/kd/rte",
                  f"the run needs about {RECORD_BYTES + teacher:,} (its record "
                  f"{RECORD_BYTES:,} + the rte teacher {teacher:,})")]
    for results, cache, folder, needs in cases:
        refused = CliRunner().invoke(app, run_command(tiny_suite_file, results, cache))
        assert refused.exit_code == 2 and "Traceback" not in refused.output
        error = refused.output.strip().splitlines()[-1]
        assert re.fullmatch(rf"error: not enough space in {re.escape(str(folder))}: "
                            rf"[0-9,]+ bytes free, {re.escape(needs)}; make room there or "
                            "pass another --results / --cache-dir", error), error
        assert "[teacher]" not in refused.output and trainings == []
        assert not list(cache.rglob("*.safetensors"))


@pytest.mark.e2e
def test_the_estimate_counts_only_the_cache_entries_a_run_still_has_to_make(
        tiny_suite_file, tmp_path):
    suite = load_suite(str(tiny_suite_file))

    def needs() -> list[str]:
        runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache",
                             log=lambda _: None, save_students=True)
        plan = runner.planner.resolve("distilbert", "stsb", 1)
        return [what for _, _, what in space_needed(
            runner.planner, runner.cache, plan.method, runner.planner.prepare_task("stsb"),
            dict(plan.spec), dict(plan.stage_configs), tmp_path / "results" / "r.json",
            general_key=runner.general_entry_key, keep_student=runner.save_students)]

    assert needs() == ["its record", "the stsb teacher", "its general checkpoint",
                       "the kept student"]
    SuiteRunner(suite, tmp_path / "other", tmp_path / "cache",
                log=lambda _: None).run_one("distilbert", "stsb", seed=2)
    assert needs() == ["its record", "the kept student"]


def report_command(results: Path, out: Path) -> list[str]:
    return ["report", "--suite", "glue-cpu", "--results", str(results), "--out", str(out)]


@pytest.mark.e2e
@pytest.mark.parametrize("way", WAYS)
def test_a_report_that_cannot_be_written_leaves_the_previous_files_whole(
        way, tmp_path, tmpfs, monkeypatch):
    results = tmp_path / "results"
    store = ResultsStore(results)

    def write_records(methods: set[str]) -> None:
        for (method, student), tasks in SCORES.items():
            for task, scores in tasks.items():
                for seed, score in enumerate(scores, start=1):
                    if method in methods:
                        write_record(store, method, student, task, seed, score)

    write_records({"kd"})
    out = tmpfs("out", "16m") if way == "tmpfs" else tmp_path / "out"
    first = CliRunner().invoke(app, report_command(results, out))
    assert first.exit_code == 0, first.output
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert out / "leaderboard.md" in before and out / "figures" / "task-heatmap.png" in before
    write_records({"bilstm", "finetune"})  # each file of the next report is larger
    if way == "tmpfs":
        fill(out)
        before[out / "filler"] = (out / "filler").read_bytes()
    else:
        refuse_under(monkeypatch, out / "leaderboard.md")
    failed = CliRunner().invoke(app, report_command(results, out))
    assert failed.exit_code == 2 and "Traceback" not in failed.output
    assert failed.output.strip().splitlines()[-1] == (
        f"error: report: cannot write {out}: {NO_SPACE}; pass a writable --out folder")
    after = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert after.keys() == before.keys() and no_partial_files(out)
    assert after[out / "leaderboard.md"] == before[out / "leaderboard.md"]
    if way == "tmpfs":  # nothing could be written: every file is the previous one
        assert after == before
