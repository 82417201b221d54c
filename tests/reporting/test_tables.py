"""Comparison tables from records (harness.reporting.tables)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

from harness.experiments.runner import SuiteRunner
from harness.experiments.store import InvalidRecordError, ResultsStore
from harness.experiments.suites import load_suite
from harness.reporting.report import collect_runs
from harness.reporting.tables import finished_records, score_table, with_anchors
from tests.records import run_record

SUITE = load_suite("glue-cpu")


def write(store: ResultsStore, method: str, task: str, seed: int, score: float,
          status: str = "finished") -> None:
    store.write(store.record_path(SUITE.record_suite, method, task, f"seed{seed}"),
                run_record(status=status, method=method, task=task, seed=seed,
                           main_score=score))


def test_means_over_seeds_average_over_tasks_and_failed_runs_left_out(tmp_path):
    store = ResultsStore(tmp_path)
    for seed, (a, b) in enumerate([(80.0, 50.0), (82.0, 54.0)], start=1):
        write(store, "kd", "mrpc", seed, a)
        write(store, "kd", "rte", seed, b)
    write(store, "kd", "rte", 3, 0.0, status="failed")
    write(store, "x", "mrpc", 1, 70.0)  # no rte: no average
    table = score_table(finished_records(SUITE, tmp_path), ["mrpc", "rte"], ["x", "kd"])
    assert list(table.index) == ["x", "kd"]
    assert table.loc["kd", "mrpc"] == 81.0 and table.loc["kd", "rte"] == 52.0
    assert table.loc["kd", "average"] == pytest.approx(66.5)
    assert table.loc["kd", "seeds"] == 2
    assert table.loc["kd", "max_std"] == pytest.approx(np.std([50.0, 54.0], ddof=1))
    assert pd.isna(table.loc["x", "average"]) and pd.isna(table.loc["x", "rte"])


def test_anchor_rows_join_beside_ours(tmp_path):
    store = ResultsStore(tmp_path)
    write(store, "kd", "mrpc", 1, 80.0)
    table = score_table(finished_records(SUITE, tmp_path), ["mrpc"])
    paper = pd.DataFrame({"paper_mrpc": [85.0, 1.0], "paper_average": [70.0, 2.0]},
                         index=["kd", "other"])
    joined = with_anchors(table, paper)
    assert joined.loc["kd", "paper_mrpc"] == 85.0 and joined.loc["kd", "mrpc"] == 80.0
    assert "other" not in joined.index


def test_runs_off_their_recipe_get_rows_of_their_own(tmp_path):
    """A tuned run, a grid-budget run and a run on another student shape are not averaged
    with the recipe's runs of the same method."""
    store = ResultsStore(tmp_path)
    write(store, "kd", "mrpc", 1, 80.0)
    variations = {"kd-tuned": {"tuned": {"study": "tune-s-kd-mrpc-x"},
                               "variation": {"overrides": {"params.alpha": 0.2}}},
                  "kd-grid": {"variation": {"task_epochs": 1.0}},
                  "kd-wide": {"variation": {"student": "wide"}}}
    for name, extra in variations.items():
        store.write(store.record_path(SUITE.record_suite, "kd", "mrpc", name),
                    run_record(method="kd", task="mrpc", seed=1, main_score=90.0, **extra))
    table = score_table(finished_records(SUITE, tmp_path), ["mrpc"])
    assert table.loc["kd", "mrpc"] == 80.0
    assert sorted(table.index) == ["kd", "kd [grid budget]", "kd [tuned]", "kd [wide]"]


def test_ablation_changes_compare_the_same_tasks_ours_and_the_papers(tmp_path):
    """``change`` is against the full model on our tasks; ``paper_change`` on the paper's
    values of those same tasks, not on the paper's average over tasks we do not have."""
    from harness.reporting.tables import with_changes

    store = ResultsStore(tmp_path)
    for method, (mrpc, cola) in {"full": (80.0, 20.0), "no-x": (78.0, 10.0),
                                 "no-y": (81.0, 0.0)}.items():
        write(store, method, "mrpc", 1, mrpc)
        write(store, method, "cola", 1, cola)
    write(store, "partial", "mrpc", 1, 90.0)
    table = score_table(finished_records(SUITE, tmp_path), ["mrpc", "cola"],
                        ["full", "no-x", "no-y", "partial"])
    paper = pd.DataFrame({"paper_mrpc": [86.0, 84.0], "paper_cola": [50.0, 40.0],
                          "paper_mnli": [83.0, 70.0], "paper_average": [73.0, 64.7]},
                         index=["full", "no-x"])
    changed = with_changes(with_anchors(table, paper), "full", ["mrpc", "cola"])
    assert changed.loc["full", "change"] == 0.0
    assert changed.loc["no-x", "change"] == pytest.approx(-6.0)   # (78+10)/2 - (80+20)/2
    assert changed.loc["no-y", "change"] == pytest.approx(-9.5)
    assert changed.loc["no-x", "paper_change"] == pytest.approx(-6.0)  # MNLI left out
    assert pd.isna(changed.loc["no-y", "paper_change"])  # no paper row
    assert pd.isna(changed.loc["partial", "change"])  # no CoLA
    assert with_changes(table, "absent", ["mrpc"]).equals(table)


def test_ablation_p_is_the_sign_flip_test_against_the_full_model(tmp_path):
    from harness.reporting.tables import with_paired_p

    store = ResultsStore(tmp_path)
    for seed in (1, 2, 3):
        for task, full in (("mrpc", 80.0), ("cola", 20.0)):
            write(store, "full", task, seed, full + seed)
            write(store, "worse", task, seed, full + seed - 5.0)  # below on all 6 pairs
            write(store, "mixed", task, seed, full + seed + (1.0 if seed == 1 else -1.0))
    records = finished_records(SUITE, tmp_path)
    table = with_paired_p(score_table(records, ["mrpc", "cola"]), records, "full")
    assert pd.isna(table.loc["full", "p_change"])
    assert table.loc["worse", "p_change"] == pytest.approx(2 / 64)  # the exact minimum
    assert table.loc["mixed", "p_change"] > 0.2
    # as `harness table` prints it: p at three decimals, seeds whole
    from harness.reporting.tables import markdown

    lines = markdown(table).splitlines()
    header = [cell.strip() for cell in lines[0].split("|")]
    worse = [cell.strip() for cell in next(
        line for line in lines if line.startswith("| worse")).split("|")]
    assert worse[header.index("p_change")] == "0.031"
    assert worse[header.index("seeds")] == "3" and worse[header.index("mrpc")] == "77.00"
    # the variants are read together: Holm over the two tested (0.031 doubled)
    assert pd.isna(table.loc["full", "p_holm"])
    assert table.loc["worse", "p_holm"] == pytest.approx(2 * 2 / 64)
    assert table.loc["mixed", "p_holm"] == pytest.approx(max(2 * 2 / 64,
                                                             table.loc["mixed", "p_change"]))


@pytest.mark.e2e
def test_a_row_never_averages_two_configurations(tiny_suite_file, tmp_path):
    """A run made with a --set (or by an earlier recipe) into the suite's store has the
    recipe's row label: tables keep the runs of the suite as each reads, never both."""
    results, cache = tmp_path / "results", tmp_path / "cache"
    suite = load_suite(str(tiny_suite_file), ["seeds=[1, 2]"])
    runner = SuiteRunner(suite, results, cache, log=lambda _: None)
    recipe_ids = {seed: runner.run_one("finetune", "rte", seed).path.stem[-16:]
                  for seed in (1, 2)}
    edited = load_suite(str(tiny_suite_file), ["seeds=[1, 2]", "training.lr=0.002"])
    edited_id = SuiteRunner(edited, results, cache, log=lambda _: None).run_one(
        "finetune", "rte", 1).path.stem[-16:]
    assert edited_id not in recipe_ids.values()

    logged: list[str] = []
    runs, _ = collect_runs(suite, results, log=logged.append)
    rte = runs[(runs["label"] == "finetune") & (runs["task"] == "rte")]
    assert sorted(rte["seed"]) == [1, 2]
    assert {run_id[:16] for run_id in rte["run_id"]} == set(recipe_ids.values())
    assert any(line.startswith("left out 1 record") for line in logged)
    assert any(edited_id in line for line in logged)

    runs, _ = collect_runs(edited, results, log=lambda _: None)
    rte = runs[(runs["label"] == "finetune") & (runs["task"] == "rte")]
    assert [run_id[:16] for run_id in rte["run_id"]] == [edited_id]
    table = finished_records(suite, results, log=lambda _: None)
    assert sorted(table[table["task"] == "rte"]["seed"]) == [1, 2]


@pytest.mark.e2e
def test_a_record_copied_under_another_run_id_is_refused_naming_the_copy(tiny_suite_file,
                                                                         tmp_path):
    """One configuration and seed is one run: a hand-edited copy of a record (another run id
    and score, the same configuration) was counted as a second run of that seed, and moved
    the mean.  Its run id is not the hash of its configuration, so it does not load: the
    table stops and names it."""
    results = tmp_path / "results"
    suite = load_suite(str(tiny_suite_file))
    path = SuiteRunner(suite, results, tmp_path / "cache", log=lambda _: None).run_one(
        "finetune", "rte", 1).path
    store = ResultsStore(results)
    genuine = store.load(path)
    forged = genuine.model_copy(update={"run_id": "0" * 64, "config_hash": "0" * 64,
                                        "main_score": 99.0,
                                        "finished_at": "2999-01-01T00:00:00+00:00"})
    copy = path.with_name("tiny-seed1-copy.json")
    copy.write_text(json.dumps(forged.document()))
    named = rf"{re.escape(str(copy))}: .*run id 0000000000000000 is not the hash of its config"
    with pytest.raises(InvalidRecordError, match=named):
        collect_runs(suite, results, log=lambda _: None)
    copy.unlink()
    runs, _ = collect_runs(suite, results, log=lambda _: None)
    assert list(runs["score"]) == [pytest.approx(genuine.main_score)]


@pytest.mark.e2e
def test_of_one_seeds_two_auto_resolutions_the_later_run_counts(tiny_suite_file, tmp_path):
    """The same recipe recorded in both resolutions of ``auto`` (two machines, one seed):
    both are the recipe's runs, and the row counts the seed once."""
    from harness.common.cache import content_hash
    from harness.common.precision import AUTO_RESOLUTIONS
    from harness.experiments.planner import RunPlanner

    results = tmp_path / "results"
    suite = load_suite(str(tiny_suite_file), ["training.mixed_precision=auto"])
    path = SuiteRunner(suite, results, tmp_path / "cache", log=lambda _: None).run_one(
        "finetune", "rte", 1).path
    store = ResultsStore(results)
    made = store.load(path)
    ran_in = next(iter(made.config["stages"].values()))["mixed_precision"]
    other = next(resolution for resolution in AUTO_RESOLUTIONS
                 if resolution["mixed_precision"] != ran_in)
    planner = RunPlanner(suite, torch.device("cpu"), log=lambda _: None, precision=other)
    spec = planner.resolve("finetune", "rte", 1).spec
    twin = made.model_copy(update={"config": spec, "run_id": content_hash(spec),
                                   "config_hash": content_hash(spec), "main_score": 1.0,
                                   "finished_at": "2999-01-01T00:00:00+00:00"})
    store.write(path.with_name(f"tiny-seed1-{twin.run_id[:16]}.json"), twin)

    logged: list[str] = []
    runs, _ = collect_runs(suite, results, log=logged.append)
    rte = runs[(runs["label"] == "finetune") & (runs["task"] == "rte")]
    assert list(rte["score"]) == [1.0] and list(rte["run_id"]) == [twin.run_id]
    assert any("the later counts" in line for line in logged)


@pytest.mark.e2e
def test_a_row_of_an_earlier_recipe_is_shown_marked_and_named(tiny_suite_file, tmp_path):
    """A row whose runs are all of an earlier recipe (kd's, before its alpha was edited)
    stays in the table, marked and named with its task; a current row is not."""
    import yaml
    from typer.testing import CliRunner

    from harness.cli import app

    results, cache = tmp_path / "results", tmp_path / "cache"
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), results, cache, log=lambda _: None)
    for method in ("finetune", "kd"):
        runner.run_one(method, "rte", 1)
    document = yaml.safe_load(tiny_suite_file.read_text())
    document["methods"]["kd"] = {"params": {"alpha": 0.2}}
    edited_file = tmp_path / "edited.yaml"
    edited_file.write_text(yaml.safe_dump(document))
    edited = load_suite(str(edited_file))

    shown = CliRunner().invoke(app, ["table", "--suite", str(edited_file), "--results",
                                     str(results)])
    assert shown.exit_code == 0, shown.output
    rows = [line.split("|")[1].strip() for line in shown.output.splitlines()[2:]
            if line.startswith("|")]
    assert sorted(rows) == ["finetune", "kd *"]
    why = "runs of an earlier recipe or of a --set"
    assert f"  kd (tiny) on rte: {why}" in shown.output.splitlines()

    logged: list[str] = []
    runs = finished_records(edited, results, logged.append)
    assert sorted(runs["method"]) == ["finetune", "kd"]  # still shown
    assert [(row.label, row.student, row.task, row.why)
            for row in runs.attrs["not_current"]] == [("kd", "tiny", "rte", why)]
    assert any(line.startswith("* not runs of suite tiny as it now reads") for line in logged)
    assert f"  kd (tiny) on rte: {why}" in logged
    assert not any("finetune" in line for line in logged)

    logged.clear()  # as the suite read when the runs were made: nothing marked
    assert finished_records(load_suite(str(tiny_suite_file)), results,
                            logged.append).attrs["not_current"] == []
    assert logged == []


@pytest.mark.e2e
def test_table_rows_asked_for_by_name_are_those_or_an_error(tmp_path):
    """`harness table -m`: comma lists split, an unknown name and a name without records
    are errors, where they once printed every row."""
    from typer.testing import CliRunner

    from harness.cli import app

    store = ResultsStore(tmp_path)
    for method, score in (("kd", 81.0), ("finetune", 80.0), ("tinybert", 79.0)):
        write(store, method, "mrpc", 1, score)

    def table(*methods: str):
        return CliRunner().invoke(app, ["table", "--suite", "glue-cpu", "--results",
                                        str(tmp_path), *[f"-m{m}" for m in methods]])

    shown = table("kd,finetune")
    assert shown.exit_code == 0, shown.output
    rows = [line.split("|")[1].strip() for line in shown.output.splitlines()[2:]
            if line.startswith("|")]
    assert rows == ["finetune *", "kd *"]  # stub configurations: not glue-cpu's runs
    unknown = table("nosuch")
    assert unknown.exit_code == 2 and "unknown method 'nosuch'" in unknown.output
    none = table("bert-pkd")
    assert none.exit_code == 2 and "no finished records of bert-pkd" in none.output


@pytest.mark.e2e
@pytest.mark.parametrize("seeds", ["-1", "abc", "1,x"])
def test_a_seed_that_is_not_one_is_refused_before_anything_runs(tmp_path, seeds):
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.config.schema import ConfigError

    done = CliRunner().invoke(app, ["grid", "--suite", "glue-cpu", "--dry-run", "-m", "kd",
                                    "--tasks", "rte", f"--seeds={seeds}", "--results",
                                    str(tmp_path / "r")])
    assert done.exit_code == 2 and "is not a seed (a whole number from 0 to" in done.output
    with pytest.raises(ConfigError, match=r"seeds\.0: Input should be greater than or equal"):
        load_suite("glue-cpu", ["seeds=[-1, 2]"])
