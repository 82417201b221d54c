"""Export of a run's student as a Hugging Face folder: the folder loads with
AutoModelForSequenceClassification in a fresh process and scores the record's dev metric;
a student not kept is trained again and must reproduce the record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.common.cache import ArtifactCache
from harness.experiments.kept_students import STUDENT_FILE, STUDENT_KIND
from harness.experiments.runner import SuiteRunner
from harness.experiments.store import ResultsStore
from harness.experiments.student_export import ExportError, export_run, export_student
from harness.experiments.suites import load_suite
from tests.conftest import tiny_suite_dict

# Scores the exported folder on the task's dev file with nothing but transformers, torch and
# the harness's metric, in a process of its own (no state shared with the training process).
SCORE_SCRIPT = """
import json, sys
import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from harness.data.loading import load_task
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task

folder, task_name, data_dir, remote = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
task = get_task(task_name)
dev = load_task(task_name, data_dir=data_dir).splits["dev"]
code = {"trust_remote_code": True} if remote else {}
tokenizer = AutoTokenizer.from_pretrained(folder, **code)


def score(attention):
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, attn_implementation=attention, **code).eval()
    logits = []
    with torch.no_grad():
        for start in range(0, len(dev), 16):
            rows = dev[start:start + 16]
            batch = tokenizer(rows["text_a"], rows["text_b"] if task.is_pair else None,
                              truncation=True, padding=True, return_tensors="pt")
            logits.append(model(**batch).logits)
    scores = TaskEvaluator(task).score(torch.cat(logits).numpy(), np.asarray(dev["label"]))
    return scores[task.main_metric], type(model).__name__


plain, name = score("sdpa")
print(json.dumps({"score": plain, "eager_score": score("eager")[0], "class": name}))
"""


def _suite_file(tmp_path: Path, data_dir: Path, teacher_dir: Path, pooling: str,
                precision: str = "no") -> Path:
    suite = tiny_suite_dict(data_dir, teacher_dir, steps=6)
    suite["students"]["tiny"]["pooling"] = pooling
    suite["training"]["mixed_precision"] = precision
    path = tmp_path / f"tiny-{pooling}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def _score_in_fresh_process(folder: Path, task: str, data_dir: Path, remote: bool) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run([sys.executable, "-c", SCORE_SCRIPT, str(folder), task,
                           str(data_dir), "1" if remote else "0"],
                          capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.parametrize("pooling, task, precision", [("mean", "rte", "no"),
                                                       ("pooler", "stsb", "bf16")])
def test_an_exported_student_scores_the_record_in_a_fresh_process(
        tmp_path, tiny_data_dir, tiny_teacher_dir, pooling, task, precision):
    """Loaded in fp32 as the card says, a student trained in bf16 too (its stages evaluate
    in fp32, so the record's score is the one a plain load gives)."""
    suite = load_suite(str(_suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, pooling,
                                       precision)))
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None,
                         save_students=True)
    outcome = runner.run_one("kd", task, seed=1)
    record = ResultsStore(tmp_path / "results").load(outcome.path)
    out = tmp_path / "exported"
    result = export_run(record.run_id[:12], out, tmp_path / "results", tmp_path / "cache",
                        log=lambda _: None)
    assert not result.retrained and result.kept_score == record.main_score
    config = json.loads((out / "config.json").read_text())
    assert config["classifier_pooling"] == pooling
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 48
    card = (out / "README.md").read_text()
    assert record.run_id in card and record.data.fingerprint in card
    assert f"harness run --suite tiny --method kd --tasks {task} --seeds 1" in card
    # exported without --suite, the suite file it ran from is unknown: the card says so
    assert "No suite here is named tiny: the run was made from a suite file" in card
    if task == "rte":
        assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}
    remote = pooling != "pooler"
    scored = _score_in_fresh_process(out, task, tiny_data_dir, remote)
    # The record's score may come from other kernels (a GPU's, another batch composition),
    # which change float32 logits in their last bits.  This tiny student's STS-B predictions
    # spread over ~1e-5, so those bits move its Pearson by ~1e-3 (on a GPU: 9.4e-4); the
    # gap between two attention kernels in the fresh process measures that noise.  A wrong
    # model misses by points.
    noise = abs(scored["score"] - scored["eager_score"])
    assert scored["score"] == pytest.approx(record.main_score, rel=1e-6, abs=max(1e-6, 10 * noise))
    if remote:
        # a mean-pooled head is not a stock BERT: without its code the folder refuses to load
        assert config["model_type"] == "pooled_bert" and scored["class"] == \
            "PooledBertForSequenceClassification"
        with pytest.raises(ValueError, match="trust_remote_code"):
            from transformers import AutoModelForSequenceClassification

            AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=False)
    else:
        assert scored["class"] == "BertForSequenceClassification"


@pytest.mark.e2e
def test_a_student_not_kept_is_trained_again_and_must_match_the_record(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite_file = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")
    runner = SuiteRunner(load_suite(str(suite_file)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None)
    record = ResultsStore(tmp_path / "results").load(runner.run_one("kd", "rte", 1).path)
    cache = ArtifactCache(tmp_path / "cache")
    assert not cache.has(STUDENT_KIND, record.run_id)  # not kept by default
    result = export_run(record.run_id, tmp_path / "a", tmp_path / "results",
                        tmp_path / "cache", suite=str(suite_file), log=lambda _: None)
    assert result.retrained and result.kept_score == record.main_score
    assert (tmp_path / "a" / "model.safetensors").exists()
    # The card's command names the suite file it was exported with, not its name (tiny),
    # which no suite of suites/ has.
    assert (f"harness run --suite {suite_file} --method kd --tasks rte --seeds 1"
            in (tmp_path / "a" / "README.md").read_text())
    # A retrained student that does not reproduce the record's score is refused, and
    # nothing is written.
    differing = tmp_path / "differing"
    shutil.copytree(cache.path(STUDENT_KIND, record.run_id), differing)
    description = json.loads((differing / STUDENT_FILE).read_text())
    description["main_score"] = record.main_score + 1.0
    (differing / STUDENT_FILE).write_text(json.dumps(description))
    with pytest.raises(ExportError, match="not the model the record measured"):
        export_student(record, tmp_path / "b", ArtifactCache(tmp_path / "empty-cache"),
                       retrain=lambda _: differing, command="harness run ...")
    assert not (tmp_path / "b").exists()
    # An altered kept student is caught by the cache's checksums and trained again.
    kept = cache.path(STUDENT_KIND, record.run_id) / STUDENT_FILE
    kept.write_text(kept.read_text().replace('"kd"', '"kx"'))
    assert not ArtifactCache(tmp_path / "cache", log=lambda _: None).has(
        STUDENT_KIND, record.run_id)


@pytest.mark.e2e
def test_a_student_kept_by_another_training_of_the_run_is_replaced_by_this_records(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """Two stores with the same run (another thread count, another machine) keep a student
    under one run id: the later training's replaces the earlier, and export of a record
    whose student is not the kept one trains it again instead of refusing."""
    suite_file = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")
    runner = SuiteRunner(load_suite(str(suite_file)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None, save_students=True)
    record = ResultsStore(tmp_path / "results").load(runner.run_one("kd", "rte", 1).path)
    cache = ArtifactCache(tmp_path / "cache")
    kept = cache.path(STUDENT_KIND, record.run_id)
    other = tmp_path / "other-training"
    shutil.copytree(kept, other)
    description = json.loads((other / STUDENT_FILE).read_text())
    description["main_score"] = record.main_score + 1.0  # what another training reached
    with cache.build(STUDENT_KIND, record.run_id, {"run_id": record.run_id},
                     replace=True) as folder:
        for path in other.iterdir():
            if path.name not in {"key.json", "COMPLETE"}:
                shutil.copy2(path, folder / path.name)
        (folder / STUDENT_FILE).write_text(json.dumps(description))
    fresh = ArtifactCache(tmp_path / "cache")
    assert fresh.has(STUDENT_KIND, record.run_id)  # a whole entry: the other training's
    assert json.loads((kept / STUDENT_FILE).read_text())["main_score"] == \
        record.main_score + 1.0
    assert not list(kept.parent.glob(".replaced-*"))
    result = export_run(record.run_id, tmp_path / "a", tmp_path / "results",
                        tmp_path / "cache", suite=str(suite_file), log=lambda _: None)
    assert result.retrained and result.kept_score == record.main_score
    assert json.loads((kept / STUDENT_FILE).read_text())["main_score"] == record.main_score


@pytest.mark.e2e
def test_export_refuses_what_it_cannot_write(tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite_file = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")
    runner = SuiteRunner(load_suite(str(suite_file)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None, save_students=True)
    record = ResultsStore(tmp_path / "results").load(runner.run_one("kd", "rte", 1).path)
    with pytest.raises(ExportError, match="at least its first 8"):
        export_run("abc", tmp_path / "x", tmp_path / "results", tmp_path / "cache")
    with pytest.raises(ExportError, match=r"no record .* starting with 'ffffffffff'"):
        export_run("ffffffffff", tmp_path / "x", tmp_path / "results", tmp_path / "cache")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_run(record.run_id, tmp_path / "full", tmp_path / "results", tmp_path / "cache")
    # another suite's recipe does not resolve to the run id: no retraining from it
    changed = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "cls")
    with pytest.raises(ExportError, match="resolves to run id"):
        export_run(record.run_id, tmp_path / "y", tmp_path / "results", tmp_path / "nocache",
                   suite=str(changed))
    result = CliRunner().invoke(app, ["export", record.run_id[:10], str(tmp_path / "z"),
                                      "--results", str(tmp_path / "results"),
                                      "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 0, result.output
    assert "exported the kept student" in result.output
    assert "trust_remote_code=True" in result.output
    assert "from transformers import AutoModelForSequenceClassification;" in result.output
    # A target that is a file, or under one, is refused before a student is trained for it
    (tmp_path / "afile").write_text("mine")
    for target, problem in [(tmp_path / "afile", "afile is a file, not a folder"),
                            (tmp_path / "afile" / "sub", "afile is a file, not a folder")]:
        with pytest.raises(ExportError, match=problem):
            export_student(record, target, ArtifactCache(tmp_path / "empty-cache"),
                           retrain=lambda _: pytest.fail("trained for a target it refuses"),
                           command="harness run ...")
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.e2e
def test_a_damaged_kept_student_that_cannot_be_trained_again_is_named(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """The cache removes a damaged kept student; when no suite here trains the run again,
    the error says the student was damaged instead of blaming only the recipe."""
    suite_file = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")
    runner = SuiteRunner(load_suite(str(suite_file)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None, save_students=True)
    record = ResultsStore(tmp_path / "results").load(runner.run_one("kd", "rte", 1).path)
    weights = ArtifactCache(tmp_path / "cache").path(STUDENT_KIND, record.run_id) / \
        "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    changed = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "cls")
    with pytest.raises(ExportError, match=r"was damaged .* and was removed, and it cannot be "
                                          r"trained again here: .*resolves to run id"):
        export_run(record.run_id, tmp_path / "out", tmp_path / "results", tmp_path / "cache",
                   suite=str(changed), log=lambda _: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_kept_student_exports_where_training_it_needs_an_asset_this_machine_lacks(
        tmp_path, tiny_data_dir, tiny_teacher_dir, monkeypatch):
    """Only training needs a method's assets (GloVe vectors, say): on a machine without
    them a kept student still exports, its card says why the run cannot be trained here,
    and a student that is not kept is refused with the asset named."""
    from methods.kd import VanillaKD

    suite_file = _suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")
    runner = SuiteRunner(load_suite(str(suite_file)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None, save_students=True)
    record = ResultsStore(tmp_path / "results").load(runner.run_one("kd", "rte", 1).path)
    monkeypatch.setattr(VanillaKD, "missing_assets",
                        lambda self: "the vectors need the package 'some-vectors'")
    result = export_run(record.run_id, tmp_path / "out", tmp_path / "results",
                        tmp_path / "cache", suite=str(suite_file), log=lambda _: None)
    assert not result.retrained and result.kept_score == record.main_score
    card = (tmp_path / "out" / "README.md").read_text()
    assert "# This machine cannot train it: methods.kd: the vectors need the package " \
           "'some-vectors'" in card
    with pytest.raises(ExportError, match=r"this machine cannot train it: methods.kd: the "
                                          r"vectors need .*install what it lacks"):
        export_run(record.run_id, tmp_path / "out2", tmp_path / "results",
                   tmp_path / "empty-cache", suite=str(suite_file), log=lambda _: None)


@pytest.mark.e2e
def test_keeping_students_of_recorded_runs_says_they_were_not_kept(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """--save-students on a run that is recorded skips it and keeps nothing: it says so,
    and how to keep it."""
    suite = load_suite(str(_suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")))
    record = ResultsStore(tmp_path / "results").load(SuiteRunner(
        suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None
    ).run_one("kd", "rte", 1).path)
    messages: list[str] = []
    outcome = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache",
                          log=messages.append, save_students=True).run_one("kd", "rte", 1)
    assert outcome.status == "skipped"
    assert any(message.startswith("[student] not kept: kd rte seed 1 is recorded")
               and f"harness export {record.run_id[:16]} <folder>" in message
               for message in messages), messages


# Scores a student exported in its method's own format with the harness's documented loader,
# in a process of its own.
SCORE_OWN_FORMAT_SCRIPT = """
import json, sys
import numpy as np
from harness import load_student
from harness.data.loading import load_task
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task

folder, task_name, data_dir = sys.argv[1], sys.argv[2], sys.argv[3]
task = get_task(task_name)
dev = load_task(task_name, data_dir=data_dir).splits["dev"]
student = load_student(folder)
logits = student.predict(dev["text_a"], dev["text_b"] if task.is_pair else None, batch_size=16)
scores = TaskEvaluator(task).score(logits, np.asarray(dev["label"]))
print(json.dumps({"score": scores[task.main_metric], "labels": student.id2label,
                  "class": type(student).__name__}))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("task", ["rte", "stsb"])
def test_a_bilstm_student_exports_in_its_own_format_and_scores_the_record(
        tmp_path, tiny_data_dir, tiny_teacher_dir, task):
    suite = load_suite(str(_suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir, "mean")))
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None,
                         save_students=True)
    record = ResultsStore(tmp_path / "results").load(
        runner.run_one("bilstm-soft", task, seed=1).path)
    kept = json.loads((ArtifactCache(tmp_path / "cache").path(STUDENT_KIND, record.run_id)
                       / STUDENT_FILE).read_text())
    assert (kept["kind"], kept["plugin"]) == ("plugin", "bilstm-soft")
    out = tmp_path / "exported"
    result = export_run(record.run_id, out, tmp_path / "results", tmp_path / "cache",
                        log=lambda _: None)
    assert not result.retrained and result.loads_with == "load_student(folder)"
    assert {path.name for path in out.iterdir()} == {
        "config.json", "vocabulary.json", "model.safetensors", "harness_student.json",
        "README.md"}
    card = (out / "README.md").read_text()
    assert "from harness import load_student" in card and record.run_id in card
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run([sys.executable, "-c", SCORE_OWN_FORMAT_SCRIPT, str(out), task,
                           str(tiny_data_dir)], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    scored = json.loads(done.stdout.strip().splitlines()[-1])
    assert scored["class"] == "ExportedBiLSTM"
    # float32 logits from other batch compositions differ in the last bits; a Pearson score
    # moves by ~1e-7 with them, a wrong model by far more
    assert scored["score"] == pytest.approx(record.main_score, rel=1e-6, abs=1e-6)
    assert scored["labels"] == ({"0": "score"} if task == "stsb" else
                                {"0": "entailment", "1": "not_entailment"})

    # the loader names what it cannot read
    from harness import load_student

    with pytest.raises(ExportError, match="not a student exported"):
        load_student(tmp_path / "results")
    student = load_student(out)
    with pytest.raises(ValueError, match="reads sentence pairs"):
        student.predict(["only one sentence"])


@pytest.mark.slow
def test_the_cards_command_names_the_suite_that_trains_the_run_and_a_zero_share_is_shown():
    """A tinybert-ablation variant records into glue-cpu's store; its card's command must
    name tinybert-ablation, whose recipe gives the run id (glue-cpu does not declare the
    variant). A student at 0% of its teacher (CoLA MCC 0) shows 0.0, not '-'."""
    import torch

    from harness.common.cache import content_hash
    from harness.experiments.planner import RunPlanner, Variation
    from harness.experiments.record import RunRecord
    from harness.experiments.student_export import model_card, reproduce_command, suite_for
    from tests.records import run_record

    ablation = load_suite("tinybert-ablation")
    assert ablation.record_suite == "glue-cpu"
    planner = RunPlanner(ablation, torch.device("cpu"), log=lambda message: None,
                         precision="fp32")
    spec = planner.resolve("tinybert-no-da", "cola", 2, Variation()).spec
    planned = run_record(suite="glue-cpu", method="tinybert-no-da", task="cola", seed=2,
                         student_shape="4L-192", main_metric="mcc", main_score=0.0,
                         teacher_main_score=40.0).model_dump()
    record = RunRecord.model_validate({**planned, "config": spec, "run_id": content_hash(spec),
                                       "config_hash": content_hash(spec)})
    chosen, _ = suite_for(record)
    command = reproduce_command(record, chosen.name)
    assert command == (f"harness run --suite tinybert-ablation --method tinybert-no-da "
                       f"--tasks cola --seeds {record.seed}")
    assert reproduce_command(record, "tiny", ["training.lr=3e-4"]).endswith(
        "--set training.lr=3e-4")
    card = model_card(record.model_copy(update={"pct_of_teacher": 0.0}), "AutoModel", command)
    assert "| % of teacher | 0.0 |" in card
    assert "| % of teacher | - |" in model_card(
        record.model_copy(update={"pct_of_teacher": None}), "AutoModel", command)


@pytest.mark.e2e
def test_every_command_runs_as_a_module_too():
    """``python -m harness.cli`` (how docs/benchmarks.md runs a checkout) has every command
    the ``harness`` entry point has, export included."""
    result = subprocess.run([sys.executable, "-m", "harness.cli", "export", "--help"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert "Hugging Face" in result.stdout


def test_a_refused_export_leaves_no_folder_behind(tmp_path):
    """The checks on the student come before anything is written, and a refusal while
    writing removes the folder it made (a mean-pooled RoBERTa has no loadable folder)."""
    from tests.records import run_record

    record = run_record()
    source = tmp_path / "kept"
    source.mkdir()
    (source / STUDENT_FILE).write_text(json.dumps({
        "main_score": record.main_score, "kind": "transformers", "class": "x"}))
    (source / "config.json").write_text(json.dumps({"model_type": "roberta",
                                                    "classifier_pooling": "mean"}))
    out_dir = tmp_path / "out" / "student"
    with pytest.raises(ExportError, match="pooling: pooler"):
        export_student(record, out_dir, ArtifactCache(tmp_path / "cache"),
                       retrain=lambda _: source, command="harness run")
    assert not out_dir.exists()


def test_load_student_reads_a_home_relative_path(tmp_path, monkeypatch):
    """``load_student("~/students/x")`` (docs/export.md) looks in the home folder."""
    from harness import load_student

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "students" / "x").mkdir(parents=True)
    with pytest.raises(ExportError) as info:
        load_student("~/students/x")
    assert str(tmp_path / "students" / "x") in str(info.value)
