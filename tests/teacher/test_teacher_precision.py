"""Precision of the cached teacher logits (teacher.inference_precision) and the student's
opt-in torch.compile: validated, keyed, recorded, and leaving every existing id alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.assets.checkpoints import Checkpoint
from harness.common.cache import CACHE_VERSION, content_hash
from harness.config.schema import ConfigError, TeacherConfig, TrainConfig
from harness.data.tasks import get_task
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.outputs import autocast_setting
from harness.teacher.preparation import teacher_key

CHECKPOINT = Checkpoint("pypi:x", "/nowhere", {"config": "c", "weights": {"w": "d"}})


def test_fp32_keeps_the_teacher_key_it_always_had_and_bf16_gets_its_own():
    """best-dev selection with fp32 logits keys the teacher as before either option existed;
    selection: last, mean pooling and bf16 logits each key an entry of their own."""
    task, training = get_task("rte"), TrainConfig()
    fp32 = TeacherConfig(checkpoint="pypi:x", pooling="pooler")
    legacy = content_hash({  # the key's recipe before inference_precision existed
        "kind": "teacher", "cache_version": CACHE_VERSION, "checkpoint": CHECKPOINT.identity,
        "task": "rte", "data": "fingerprint", "finetune": True,
        "training": training.identity(), "seed": 42, "max_seq_length": 128})
    assert teacher_key(CHECKPOINT, task, "fingerprint", fp32, training, 128,
                       "best-dev") == legacy
    last = teacher_key(CHECKPOINT, task, "fingerprint", fp32, training, 128)
    assert last != legacy
    assert last == teacher_key(CHECKPOINT, task, "fingerprint", fp32, training, 128, "last")
    mean = fp32.model_copy(update={"pooling": "mean"})
    assert teacher_key(CHECKPOINT, task, "fingerprint", mean, training, 128,
                       "best-dev") != legacy
    bf16 = fp32.model_copy(update={"inference_precision": "bf16"})
    assert teacher_key(CHECKPOINT, task, "fingerprint", bf16, training, 128) not in {
        legacy, last, teacher_key(CHECKPOINT, task, "other data", bf16, training, 128)}


def test_options_are_validated_with_their_path(tiny_suite_file):
    with pytest.raises(ConfigError, match=r"teacher\.inference_precision"):
        load_suite(str(tiny_suite_file), ["teacher.inference_precision=fp16"])
    with pytest.raises(ConfigError, match=r"teacher\.intermediate_cache\.max_gb"):
        load_suite(str(tiny_suite_file), ["teacher.intermediate_cache.max_gb=0"])
    with pytest.raises(ConfigError, match=r"training\.compile"):
        load_suite(str(tiny_suite_file), ["training.compile=maybe"])
    with pytest.raises(ValueError, match="fp16"):
        autocast_setting("fp16")


def test_compile_enters_a_training_identity_only_when_on():
    assert "compile" not in TrainConfig().identity()
    assert TrainConfig(compile=True).identity()["compile"] is True


def _runner(suite_file: Path, tmp_path: Path, overrides: list[str]) -> SuiteRunner:
    return SuiteRunner(load_suite(str(suite_file), overrides), tmp_path / "results",
                       tmp_path / "cache", log=lambda _: None)


@pytest.mark.e2e
def test_bf16_logits_reuse_the_fine_tuned_teacher_and_are_recorded(tiny_suite_file, tmp_path):
    fp32 = _runner(tiny_suite_file, tmp_path, [])
    bf16 = _runner(tiny_suite_file, tmp_path, ["teacher.inference_precision=bf16"])
    base, labelled = fp32.teacher("rte"), bf16.teacher("rte")
    teachers = [p for p in (tmp_path / "cache" / "teachers").iterdir()
                if not p.name.startswith(".")]
    assert len(teachers) == 2  # one fine-tuning; the bf16 entry holds logits only
    assert labelled.key != base.key and labelled.model_path == base.model_path
    assert not (labelled.path / "model").exists()
    assert (base.inference_precision, labelled.inference_precision) == ("fp32", "bf16")
    for split in ("train", "dev"):
        ours, reference = np.asarray(labelled.logits(split)), np.asarray(base.logits(split))
        assert ours.shape == reference.shape
        assert 0 < np.abs(ours - reference).max() < 0.1  # bf16 arithmetic, same model
    assert fp32.planner.run_id("kd", "rte", 1) != bf16.planner.run_id("kd", "rte", 1)
    record = json.loads(bf16.run_one("kd", "rte", seed=1).path.read_text())
    assert record["teacher"]["inference_precision"] == "bf16"
    assert record["teacher"]["key"] == labelled.key == record["config"]["teacher"]["key"]


@pytest.mark.e2e
def test_a_fresh_teacher_does_not_depend_on_what_ran_before_it(tiny_suite_file, tmp_path):
    """The classifier head is initialised after seeding: two builds of the same teacher,
    after different use of the global random generators, cache identical logits (CI found
    a tuning test whose teacher changed with the test order)."""
    import torch

    logits = []
    for name, noise in (("first", 1), ("second", 1000)):
        torch.rand(noise)  # whatever ran earlier in the process
        np.random.rand(noise)
        runner = _runner(tiny_suite_file, tmp_path / name, [])
        logits.append(np.asarray(runner.teacher("rte").logits("dev")))
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.e2e
def test_bf16_logits_of_a_teacher_fine_tuned_again_with_other_weights_are_made_again(
        tiny_suite_file, tmp_path):
    """The bf16 entry holds logits of the fp32 entry's model, under a key that names the
    teacher's recipe, not its weights: when that entry is damaged and fine-tuned again
    with other weights (another thread count), the old logits are not served beside it."""
    from safetensors.torch import load_file, save_file

    from harness.common.cache import file_manifest

    base = _runner(tiny_suite_file, tmp_path, []).teacher("rte")
    labelled = _runner(tiny_suite_file, tmp_path, ["teacher.inference_precision=bf16"]
                       ).teacher("rte")
    assert labelled.model_key == base.key
    before = np.array(labelled.logits("dev"))
    # What fine-tuning again with other weights leaves: a whole entry with other files.
    weights = base.model_path / "model.safetensors"
    state = load_file(weights)
    state = {name: value * 1.5 for name, value in state.items()}
    save_file(state, weights, metadata={"format": "pt"})
    description = json.loads((base.path / "key.json").read_text())
    description["files"] = file_manifest(base.path)
    (base.path / "key.json").write_text(json.dumps(description))
    lines: list[str] = []
    again = SuiteRunner(load_suite(str(tiny_suite_file), ["teacher.inference_precision=bf16"]),
                        tmp_path / "results", tmp_path / "cache", log=lines.append)
    again.cache.log = lines.append
    relabelled = again.teacher("rte")
    assert any(f"teachers/{labelled.key[:16]} is damaged (it was made from another build "
               f"of teachers/{base.key[:16]})" in line for line in lines), lines
    assert not np.array_equal(np.asarray(relabelled.logits("dev")), before)


@pytest.mark.e2e
def test_bf16_logits_stay_when_their_teacher_is_made_again_with_the_same_weights(
        tiny_suite_file, tmp_path):
    """A damaged fp32 entry fine-tuned again on the same machine has the same weights and
    logits; only its summary's timings differ, which is no reason to label again (nor to
    make intermediate arrays or augmented-copy logits again)."""
    labelled = _runner(tiny_suite_file, tmp_path, ["teacher.inference_precision=bf16"]
                       ).teacher("rte")
    base = labelled.model_key
    dev = tmp_path / "cache" / "teachers" / base / "logits" / "dev.npy"
    dev.write_bytes(dev.read_bytes()[:10])  # damaged: the entry is fine-tuned again
    lines: list[str] = []
    again = SuiteRunner(load_suite(str(tiny_suite_file), ["teacher.inference_precision=bf16"]),
                        tmp_path / "results", tmp_path / "cache", log=lines.append)
    again.cache.log = lines.append
    relabelled = again.teacher("rte")
    assert any(f"teachers/{base[:16]} is damaged" in line for line in lines), lines
    assert not any("made from another build" in line for line in lines), lines
    assert not any("logits of the cached teacher" in line for line in lines), lines
    np.testing.assert_array_equal(np.asarray(relabelled.logits("dev")),
                                  np.asarray(labelled.logits("dev")))


@pytest.mark.e2e
def test_a_teacher_labels_its_training_and_dev_splits_not_the_hidden_test_split(
        tiny_data_dir, tiny_teacher_dir, tmp_path):
    """Nothing reads a teacher's logits on a test split (its gold labels are hidden), and
    labelling RTE's 3,000 test pairs cost longer than its other splits together: the entry
    of either precision holds the training and dev splits' logits only (a run prepares
    no other split: the test file enters the data fingerprint only)."""
    import shutil

    import yaml

    from tests.conftest import tiny_suite_dict

    data = shutil.copytree(tiny_data_dir, tmp_path / "glue")
    rows = (data / "RTE" / "dev.tsv").read_text().splitlines()
    (data / "RTE" / "test.tsv").write_text("\n".join(
        [rows[0]] + ["\t".join([*row.split("\t")[:2], "-1", row.split("\t")[3]])
                     for row in rows[1:]]) + "\n")
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(data, tiny_teacher_dir)))
    for precision in ("fp32", "bf16"):
        runner = _runner(suite_file, tmp_path, [f"teacher.inference_precision={precision}"])
        prepared = runner.planner.prepare_task("rte")
        assert prepared.data.files["test"] == "RTE/test.tsv"  # the data has one
        assert set(prepared.splits) == {"train", "dev"}
        teacher = runner.teacher("rte")
        assert sorted(path.name for path in (teacher.path / "logits").iterdir()) == [
            "dev.npy", "train.npy"], precision


@pytest.mark.e2e
def test_a_teachers_logits_on_a_split_it_does_not_label_are_refused_by_name(
        tiny_suite_file, tmp_path):
    """A test split's logits are not made: asking for them says so, not a missing file
    under the cache that reads as a damaged entry.  An entry written when teachers also
    labelled the test split (its checksums include test.npy) is used as it is, not
    rebuilt, and refuses them alike."""
    from harness.common.cache import DESCRIPTION, file_manifest
    from harness.teacher.preparation import labelled_splits

    assert labelled_splits(get_task("mnli")) == ("train", "dev_matched", "dev_mismatched")
    assert labelled_splits(get_task("rte")) == ("train", "dev")
    teacher = _runner(tiny_suite_file, tmp_path, []).teacher("rte")
    with pytest.raises(ValueError, match=r"the RTE teacher has no logits on 'test': it "
                                         r"labels train, dev only"):
        teacher.logits("test")
    # The entry as the harness wrote it before: test.npy beside the other splits' logits.
    np.save(teacher.path / "logits" / "test.npy", np.zeros((3, 2), dtype=np.float32))
    description = json.loads((teacher.path / DESCRIPTION).read_text())
    description["files"] = file_manifest(teacher.path)
    (teacher.path / DESCRIPTION).write_text(json.dumps(description))
    lines: list[str] = []
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                         tmp_path / "cache", log=lines.append)
    reused = runner.teacher("rte")
    assert reused.path == teacher.path and (reused.path / "logits" / "test.npy").exists()
    assert not any("teacher" in line or "damaged" in line for line in lines), lines
    np.testing.assert_array_equal(np.asarray(reused.logits("dev")),
                                  np.asarray(teacher.logits("dev")))
    with pytest.raises(ValueError, match="no logits on 'test'"):
        reused.logits("test")
