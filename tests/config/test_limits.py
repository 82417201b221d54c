"""Limits checked before anything is rendered or trained: YAML whose aliases would expand it
past a size, values quoted in errors, sequence lengths against the teacher's positions,
LaTeX specials in the report, and training files of a single class."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.assets.checkpoints import TeacherError
from harness.cli import app
from harness.config.schema import MAX_YAML_VALUES, ConfigError, parse_assignment
from harness.experiments.planner import RunPlanner, usable_positions
from harness.experiments.suites import load_suite
from harness.reporting.report import (
    ReportInputs,
    _latex,
    collect_runs,
    latex_escape,
    leaderboard,
)
from tests.conftest import tiny_suite_dict, write_tiny_glue
from tests.records import run_record

# --------------------------------------------------------------------------- YAML sizes


def billion_laughs(levels: int = 9, indent: str = "") -> str:
    """The classic alias bomb: each level a list of nine aliases of the level below, so the
    last expands to 9**levels strings from a few hundred bytes."""
    lines = [f'{indent}l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"{indent}l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]"
              for level in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.e2e
def test_an_alias_bomb_under_an_unknown_key_fails_at_once_naming_file_and_key(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text("extends: glue-cpu\nname: bomb\nlaughs:\n" + billion_laughs(indent="  "))
    started = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        load_suite(str(path))
    assert time.perf_counter() - started < 1.0
    # l5 is the first level past the budget: 9**6 strings and their lists
    assert str(error.value) == (f"{path}: laughs.l5: its aliases expand it to 597,871 values; "
                                f"a YAML document here holds at most {MAX_YAML_VALUES:,}")
    result = CliRunner().invoke(app, ["run", "--suite", str(path), "--tasks", "rte",
                                      "--results", str(tmp_path / "results")])
    assert result.exit_code == 2 and "laughs.l5: its aliases expand it" in result.output
    assert not (tmp_path / "results").exists()


def test_an_alias_bomb_in_a_set_value_and_a_value_that_contains_itself_are_refused():
    bomb = "[" + ", ".join(f"&l{n} [" + ", ".join([f"*l{n - 1}" if n else "1"] * 9) + "]"
                           for n in range(7)) + "]"
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^--set '.*': methods\.kd\.params\.x: its aliases "
                                          r"expand it to 6,\d{3},\d{3} values"):
        parse_assignment(f"methods.kd.params.x={bomb}")
    assert time.perf_counter() - started < 1.0
    with pytest.raises(ConfigError, match=r"methods\.kd\.params\.x\.y\.0: an alias makes this "
                                          "value contain itself"):
        parse_assignment("methods.kd.params.x={y: &loop [*loop]}")


def test_anchors_within_the_budget_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("extends: glue-cpu\nname: anchors\ntraining: &budget {lr: 0.0001}\n"
                    "task_training: {rte: *budget, mrpc: {<<: *budget, batch_size: 16}}\n")
    suite = load_suite(str(path))
    assert suite.task_training["mrpc"].lr == suite.task_training["rte"].lr == 0.0001


def test_a_large_value_is_quoted_cut_short(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"extends": "glue-cpu", "name": "long",
                                    "training": {"lr": "x" * 200_000}}))
    with pytest.raises(ConfigError) as error:
        load_suite(str(path))
    line = str(error.value).splitlines()[1]
    assert line.startswith("  training.lr: Input should be a valid number") and "xxx" in line
    assert len(line) < 200


# --------------------------------------------------------------------------- sequence lengths


def tiny_model(model_type: str, **changes):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(model_type, vocab_size=50, hidden_size=16,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=40, **changes)
    return config, AutoModel.from_config(config).eval()


@pytest.mark.parametrize("model_type", ["bert", "electra", "roberta", "mpnet"])
def test_usable_positions_are_the_longest_sequence_the_model_runs(model_type):
    config, model = tiny_model(model_type)
    limit, why = usable_positions(config)
    assert limit == (38 if model_type in {"roberta", "mpnet"} else 40)
    assert why.startswith("max_position_embeddings 40")
    with torch.no_grad():
        model(input_ids=torch.full((1, limit), 5))
        with pytest.raises((IndexError, RuntimeError)):
            model(input_ids=torch.full((1, limit + 1), 5))


def test_relative_positions_without_a_table_are_not_bounded():
    config, model = tiny_model("deberta-v2", position_biased_input=False,
                               relative_attention=True)
    assert usable_positions(config) is None
    with torch.no_grad():
        model(input_ids=torch.full((1, 100), 5))


@pytest.fixture
def tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir) -> Path:
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    tree["grid"] = {"methods": ["kd"], "tasks": ["rte"]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def planner(suite_file: Path, *assignments: str) -> RunPlanner:
    return RunPlanner(load_suite(str(suite_file), list(assignments)), torch.device("cpu"),
                      log=lambda _: None)


def test_a_sequence_longer_than_the_teachers_positions_is_refused_before_planning(tiny_suite):
    # the tiny teacher has 128 positions
    planner(tiny_suite, "data.max_seq_length.pair=128").check_assets(["kd"], ["rte"])
    with pytest.raises(ConfigError) as error:
        planner(tiny_suite, "data.max_seq_length.pair=129").check_assets(["kd"], ["rte"])
    assert str(error.value).startswith(
        f"{tiny_suite}: data.max_seq_length.pair (from --set data.max_seq_length.pair=129): "
        "129 tokens, more than the teacher ")
    assert str(error.value).endswith(
        "has positions for (128: max_position_embeddings 128); set it to 128 or less")
    # a single-sentence length is a single-sentence task's; run ids plan through it too
    long_single = planner(tiny_suite, "data.max_seq_length.single=4000")
    long_single.check_assets(["kd"], ["rte"])
    with pytest.raises(ConfigError, match=r"data\.max_seq_length\.single .*: 4000 tokens"):
        long_single.run_id("kd", "sst2", 1)


def test_the_corpus_length_is_checked_for_the_methods_that_read_the_corpus(tiny_suite):
    written = tiny_suite.read_text().replace("name: tiny", "name: tiny\ncorpus:\n"
                                             "  max_seq_length: 200")
    tiny_suite.write_text(written)
    planner(tiny_suite).check_assets(["kd"], ["rte"])  # no corpus: its length reads nothing
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tiny_suite))}: "
                                          r"corpus\.max_seq_length: 200 tokens, more than"):
        planner(tiny_suite).check_assets(["kd", "tinybert"], ["rte"])


@pytest.mark.e2e
def test_run_and_grid_dry_run_refuse_the_length_before_anything_trains(tiny_suite, tmp_path):
    runner = CliRunner()
    common = ["--suite", str(tiny_suite), "--tasks", "rte", "--seeds", "1",
              "--set", "data.max_seq_length.pair=100000", "--results", str(tmp_path / "out"),
              "--cache-dir", str(tmp_path / "cache")]
    for command in (["run", "--method", "kd"], ["grid", "--dry-run"]):
        result = runner.invoke(app, [*command, *common])
        assert result.exit_code == 2, result.output
        assert re.search(r"data\.max_seq_length\.pair \(from --set "
                         r"data\.max_seq_length\.pair=100000\): 100000 tokens, more than the "
                         r"teacher .* \(128: max_position_embeddings 128\)", result.output)
    assert not (tmp_path / "cache").exists()  # no teacher, no tokenised data


# --------------------------------------------------------------------------- LaTeX

SPECIALS = "a\\b{c}d$e&f#g^h_i%j~k"


def unescaped(latex: str) -> list[str]:
    """The LaTeX specials left in ``latex`` once every escape of one is taken out."""
    escapes = r"\\text(?:backslash|asciicircum|asciitilde)(?:\{\}| )|\\[{}$&#_%]"
    return re.findall(r"[\\{}$&#^_%~]", re.sub(escapes, "", latex))


def test_latex_escape_escapes_every_special_and_line_break():
    escaped = latex_escape(SPECIALS + "\n\nnext")
    assert escaped == (r"a\textbackslash{}b\{c\}d\$e\&f\#g\textasciicircum{}h\_i\%j"
                       r"\textasciitilde{}k next")
    assert unescaped(escaped) == []


def test_the_latex_table_escapes_the_suite_name_and_the_row_labels(tmp_path):
    from harness.experiments.store import ResultsStore

    store = ResultsStore(tmp_path / "results")
    for seed, score in ((1, 80.0), (2, 82.0)):
        for task in ("mrpc", "rte"):
            record = run_record(suite="glue-cpu", task=task, seed=seed, main_score=score,
                                teacher_main_score=90.0)
            store.write(store.record_path("glue-cpu", "kd", task,
                                          f"4L-192-seed{seed}-{record.run_id[:16]}"), record)
    config = load_suite("glue-cpu", ["tasks=[mrpc, rte]"])
    runs, records = collect_runs(config, tmp_path / "results", log=lambda _: None)
    board = leaderboard(runs, config.tasks, teacher_label=f"teacher {SPECIALS}")
    board["student"] = board["student"].astype(str) + f" {SPECIALS}"
    named = config.model_copy(update={"name": f"suite {SPECIALS}\nline two"})
    inputs = ReportInputs(config=named, runs=runs, records=records, board=board,
                          anchors=pd.DataFrame(), published=pd.DataFrame(), bench=None,
                          comparisons=pd.DataFrame(), claims=[])
    header = {"title": f"Leaderboard: {named.name}", "command": "harness report\nx",
              "revision": "abc", "generated": "now"}
    latex = _latex(inputs, header)
    comments = [line for line in latex.splitlines() if line.startswith("%")]
    assert len(comments) == 3
    assert comments[0].endswith("line two: reproduce with harness report x")
    body = latex.split("\\begin{table}[t]", 1)[1]
    caption = re.search(r"\\caption\{(.*)\}\n\\end\{table\}", body).group(1)
    assert caption.startswith(f"suite {latex_escape(SPECIALS)} line two: main dev metric")
    rows = [line for line in body.splitlines() if line.startswith(("kd", "teacher"))]
    assert len(rows) == 2
    for text in (caption.split(":")[0], *(row.split(" & ")[0] + row.split(" & ")[1]
                                          for row in rows)):
        assert unescaped(text) == [], text


# --------------------------------------------------------------------------- single class


def single_class_glue(root: Path) -> Path:
    """Tiny RTE and STS-B whose RTE training labels are all 1 (not_entailment)."""
    write_tiny_glue(root, rows=16)
    train = root / "RTE" / "train.tsv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0], *(line.rsplit("\t", 2)[0] + f"\t1\t{index}"
                                            for index, line in enumerate(lines[1:]))]) + "\n")
    return root


@pytest.mark.e2e
def test_data_check_warns_of_a_training_file_of_one_class(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["data", "check", "--data-dir",
                                 str(single_class_glue(tmp_path / "one")), "--tasks", "rte,stsb"])
    assert result.exit_code == 0, result.output
    assert (f"  warning: {tmp_path}/one/RTE/train.tsv: all 16 of its labels are class 1 "
            "(not_entailment) of the task's 2: a model trained on it predicts that class "
            "whatever its input") in result.output
    assert "2 task(s) checked; no errors; warnings for rte" in result.output
    result = runner.invoke(app, ["data", "check", "--data-dir",
                                 str(write_tiny_glue(tmp_path / "two", rows=16))])
    assert result.exit_code == 0 and "warning" not in result.output, result.output


@pytest.mark.e2e
def test_a_teacher_under_its_margin_says_its_training_set_has_one_class(tmp_path,
                                                                         tiny_teacher_dir):
    from harness.experiments.runner import SuiteRunner

    def teacher_error(data: Path) -> str:
        tree = tiny_suite_dict(data, tiny_teacher_dir)
        tree["teacher"]["min_margin"] = 1000.0  # no teacher reaches it
        path = tmp_path / f"{data.name}.yaml"
        path.write_text(yaml.safe_dump(tree))
        runner = SuiteRunner(load_suite(str(path)), tmp_path / "results", tmp_path / "cache",
                             log=lambda _: None)
        with pytest.raises(TeacherError) as error:
            runner.teacher("rte")
        return str(error.value)

    one = teacher_error(single_class_glue(tmp_path / "one"))
    assert ("its training set holds a single class (all 16 of its labels are class 1 "
            "(not_entailment) of the task's 2") in one
    assert "`harness data check` names the file" in one
    two = teacher_error(write_tiny_glue(tmp_path / "two", rows=16))
    assert "single class" not in two and "check the checkpoint is fine-tuned" in two
