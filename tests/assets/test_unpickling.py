"""Nothing the harness reads from a cache is unpickled: a crafted pickle where a stage's
saved progress or a fitted masked-LM head is read runs nothing and is refused; saved
progress altered after it was written is refused; a cache entry whose checksums were
removed is rebuilt.  Each crafted pickle, unpickled, would create a marker file: the
tests check that it does not exist afterwards."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from harness.api.registry import instantiate
from harness.assets.checkpoints import resolve_checkpoint
from harness.assets.mlm import MLMHeadConfig, head_key, load_masked_lm
from harness.common.cache import ENTRY_FORMAT, ArtifactCache, content_hash
from harness.config.identity import MLM_HEAD_KIND
from harness.training.engine import StageCheckpoint
from harness.training.progress_file import (
    ProgressRefusedError,
    load_progress_file,
    save_progress_file,
)
from tests.training.test_stage_resume import CONFIG, Stopped, run, stopping_after


class Payload:
    """Unpickled, runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def write_torch_zip(path: Path, marker: Path) -> None:
    torch.save({"step": 2, "student": Payload(marker)}, path)


def write_pickle(protocol: int) -> Callable[[Path, Path], None]:
    def write(path: Path, marker: Path) -> None:
        path.write_bytes(pickle.dumps({"step": 2, "student": Payload(marker)},
                                      protocol=protocol))
    return write


def run_logged(checkpoint: StageCheckpoint) -> tuple[torch.Tensor, list[str]]:
    lines: list[str] = []
    weights = run(instantiate("finetune"), checkpoint, log=lines.append)[1]
    return weights, lines


@pytest.fixture(scope="module")
def uninterrupted() -> torch.Tensor:
    """The weights of the stage run once, never stopped."""
    return run(instantiate("finetune"))[1]


@pytest.mark.slow
@pytest.mark.parametrize(("write", "reason"), [
    (write_torch_zip, "saved progress in the older pickle format, which is never loaded"),
    (write_pickle(2), "saved progress in the older pickle format, which is never loaded"),
    (write_pickle(0), "unreadable saved progress ("),
], ids=["torch-save", "pickle-protocol-2", "pickle-protocol-0"])
def test_a_crafted_pickle_as_saved_progress_runs_nothing_and_the_stage_starts_over(
        tmp_path: Path, uninterrupted: torch.Tensor, write, reason: str) -> None:
    marker = tmp_path / "marker"
    # Named as the runner named saved progress when it was a pickle.
    checkpoint = StageCheckpoint(tmp_path / "general-k-general.pt", every_steps=2)
    write(checkpoint.path, marker)
    with pytest.raises(ProgressRefusedError, match=reason.replace("(", r"\(")):
        load_progress_file(checkpoint.path)
    weights, lines = run_logged(checkpoint)
    assert not marker.exists()
    assert len(lines) == 1 and lines[0].startswith(f"[engine] {checkpoint.path}: {reason}")
    assert lines[0].endswith("; starting over") and "\n" not in lines[0]
    assert torch.equal(weights, uninterrupted)  # trained from the start


def test_an_older_pickle_of_the_same_progress_is_removed_unloaded(
        tmp_path: Path, uninterrupted: torch.Tensor) -> None:
    """The runner saved progress to ``general-<key>-<stage>.pt`` before; such a file is
    named, removed, and never loaded."""
    marker = tmp_path / "marker"
    checkpoint = StageCheckpoint(tmp_path / "general-k-general.safetensors", every_steps=2)
    pickled = tmp_path / "general-k-general.pt"
    write_torch_zip(pickled, marker)
    weights, lines = run_logged(checkpoint)
    assert lines == [f"[engine] {pickled}: saved progress in the older pickle format, which "
                     "is never loaded; removed it, starting over"]
    assert not marker.exists() and not pickled.exists()
    assert torch.equal(weights, uninterrupted)


def saved_progress(tmp_path: Path, killed_at: int = 7) -> StageCheckpoint:
    """A stage of 12 steps, saving every 2, killed during step ``killed_at``."""
    checkpoint = StageCheckpoint(tmp_path / "progress.safetensors", every_steps=2)
    with pytest.raises(Stopped):
        run(stopping_after(killed_at), checkpoint)
    return checkpoint


@pytest.mark.slow
def test_genuine_saved_progress_resumes_exactly(tmp_path: Path) -> None:
    expected, weights = run(instantiate("finetune"), config=CONFIG)
    checkpoint = saved_progress(tmp_path)
    lines: list[str] = []
    resumed, resumed_weights = run(instantiate("finetune"), checkpoint, log=lines.append)
    assert lines == [f"[engine] task: resuming at step 6 of 12 from {checkpoint.path}"]
    assert torch.equal(resumed_weights, weights)
    assert [row["loss"] for row in resumed.history] == [row["loss"] for row in expected.history]


def flip_last_byte(path: Path) -> None:
    """A bit flipped in the last tensor's bytes (the file still parses)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def edit_state(path: Path) -> None:
    """The state's JSON edited (a later step), the recorded checksum kept."""
    with safe_open(path, framework="pt") as stored:
        metadata = stored.metadata()
        tensors = {name: stored.get_tensor(name) for name in stored.keys()}  # noqa: SIM118
    edited = metadata["state"].replace('["step", 6]', '["step", 8]')
    assert edited != metadata["state"]
    metadata["state"] = edited
    save_file(tensors, path, metadata=metadata)


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def header_too_large(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])


@pytest.mark.slow
@pytest.mark.parametrize(("damage", "reason"), [
    (flip_last_byte, "saved progress damaged or altered (its checksum differs from the one "
                     "saved with it)"),
    (edit_state, "saved progress damaged or altered (its checksum differs from the one "
                 "saved with it)"),
    (cut_short, "unreadable saved progress ("),
    (header_too_large, "unreadable saved progress ("),
])
def test_saved_progress_altered_after_it_was_written_is_refused(
        tmp_path: Path, uninterrupted: torch.Tensor, damage, reason: str) -> None:
    checkpoint = saved_progress(tmp_path)
    assert load_progress_file(checkpoint.path)["step"] == 6
    damage(checkpoint.path)
    with pytest.raises(ProgressRefusedError) as refused:
        load_progress_file(checkpoint.path)
    assert str(refused.value).startswith(reason)
    weights, lines = run_logged(checkpoint)
    assert len(lines) == 1 and lines[0].startswith(f"[engine] {checkpoint.path}: {reason}")
    assert lines[0].endswith("; starting over")
    assert torch.equal(weights, uninterrupted)


def test_a_progress_file_holds_what_a_stage_saves(tmp_path: Path) -> None:
    """Integer keys, tuples, non-finite numbers, None, tensors of every dtype a stage
    holds (tensors sharing memory, views) come back as they were saved."""
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"optimizer": {"state": {0: {"step": torch.tensor(3.0),
                                         "exp_avg": torch.ones(2, dtype=torch.bfloat16)}},
                           "param_groups": [{"params": [0], "betas": (0.9, 0.999),
                                             "fused": None, "amsgrad": False}]},
             "best_score": float("-inf"), "rng": torch.randint(0, 255, (16,),
                                                                dtype=torch.uint8),
             "student": {"weight": weight, "tied": weight, "column": weight[:, 1]},
             "window": {"loss": [torch.tensor(0.5), torch.tensor(0.25)]}, "scaler": None}
    path = tmp_path / "state.safetensors"
    save_progress_file(path, state)
    loaded = load_progress_file(path)
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert isinstance(loaded["optimizer"]["param_groups"][0]["betas"], tuple)
    assert list(loaded["optimizer"]["state"]) == [0]
    assert loaded["best_score"] == float("-inf") and loaded["scaler"] is None
    for name in ("weight", "tied", "column"):
        assert torch.equal(loaded["student"][name], state["student"][name])
    bf16 = loaded["optimizer"]["state"][0]["exp_avg"]
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, torch.ones(2, dtype=torch.bfloat16))
    assert torch.equal(loaded["rng"], state["rng"])
    assert [float(value) for value in loaded["window"]["loss"]] == [0.5, 0.25]
    assert [item.name for item in tmp_path.iterdir()] == ["state.safetensors"]  # no temp
    with pytest.raises(TypeError, match="saved progress: student/weight is a set"):
        save_progress_file(path, {"student": {"weight": {1, 2}}})


def test_a_crafted_pickle_as_a_fitted_mlm_head_runs_nothing(
        tmp_path: Path, tiny_teacher_dir: Path) -> None:
    """A fitted head's ``head.pt`` replaced by a pickle, its entry's checksums recorded
    anew (so the cache finds it whole): loading the head refuses it, naming the file."""
    marker = tmp_path / "marker"
    cache = ArtifactCache(tmp_path / "cache", log=lambda line: None)
    checkpoint = resolve_checkpoint(str(tiny_teacher_dir))
    corpus = [f"sentence number {index} ." for index in range(20)]
    config = MLMHeadConfig(steps=2, batch_size=4, eval_sentences=4, max_length=16)
    key = head_key(checkpoint, corpus, config, "fitted_head")
    with cache.build(MLM_HEAD_KIND, key, {"source": "fitted_head"}) as scratch:
        write_torch_zip(scratch / "head.pt", marker)
        (scratch / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="refused, it holds more than tensors") as refused:
        load_masked_lm(checkpoint, corpus, cache, config, log=lambda line: None,
                       device="cpu")
    assert str(cache.path(MLM_HEAD_KIND, key) / "head.pt") in str(refused.value)
    assert "posix.system" in str(refused.value) and "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_cache_entry_whose_checksums_were_removed_is_rebuilt(tmp_path: Path) -> None:
    """Only an entry that predates checksums (its ``key.json`` records no
    ``entry_format``) is used without them, after its files are read."""
    def built(name: str) -> tuple[str, Path]:
        key = content_hash({"entry": name})
        with ArtifactCache(tmp_path).build("teachers", key, {"task": "rte"}) as scratch:
            (scratch / "weights.bin").write_bytes(bytes(range(256)))
        return key, ArtifactCache(tmp_path).path("teachers", key)

    def edit(entry: Path, *removed: str) -> None:
        description = json.loads((entry / "key.json").read_text())
        assert description["entry_format"] == ENTRY_FORMAT
        for name in removed:
            del description[name]
        (entry / "key.json").write_text(json.dumps(description))

    key, entry = built("stripped")
    edit(entry, "files")
    lines: list[str] = []
    assert not ArtifactCache(tmp_path, log=lines.append).has("teachers", key)
    assert lines == [f"[cache] teachers/{key[:16]} is damaged (key.json records no "
                     f"checksums, though its entry_format {ENTRY_FORMAT} says they were "
                     "written); rebuilding it"]
    assert not entry.exists()

    key, entry = built("before checksums")
    edit(entry, "files", "entry_format")
    lines.clear()
    assert ArtifactCache(tmp_path, log=lines.append).has("teachers", key)
    assert lines == [f"[cache] teachers/{key[:16]}: written before checksums; recorded "
                     "them now"]
    edit(entry, "files")  # recorded with the checksums: removing them now shows
    assert not ArtifactCache(tmp_path, log=lambda line: None).has("teachers", key)

    # Written with checksums before entry_format existed: it is recorded on first use.
    key, entry = built("before entry_format")
    edit(entry, "entry_format")
    assert ArtifactCache(tmp_path, log=lambda line: None).has("teachers", key)
    edit(entry, "files")
    assert not ArtifactCache(tmp_path, log=lambda line: None).has("teachers", key)
