"""The committed reference reports (reports/) match the committed records (results/): a
method that lands with new records and no regenerated report fails here (`make report`)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.bench.efficiency import latest_bench
from harness.experiments.suites import load_suite
from harness.reporting.report import (
    collect_runs,
    efficiency_table,
    general_builds,
    general_lines,
    leaderboard,
    teacher_name,
    teacher_parameters,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
COMPARED = ["label", "student", "average", "pct_of_teacher", "params_total",
            "params_non_embedding", "speedup"]


@pytest.fixture(autouse=True, scope="module")
def _committed_records():
    """The suite's committed records under its current protocol; the checks below need at
    least one (a protocol change empties the store until its re-run lands)."""
    _, records = collect_runs(load_suite("glue-cpu"), RESULTS, grid=False)
    if not records:
        pytest.skip("no glue-cpu records under the suite's current protocol are committed")
    return records


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("grid", [True, False], ids=["grid", "all-runs"])
def test_committed_report_is_regenerated_from_the_committed_records(grid):
    config = load_suite("glue-cpu")
    folder = REPO / "reports" / ("glue-cpu-grid" if grid else "glue-cpu")
    committed = pd.read_csv(folder / "leaderboard.csv")
    committed = committed[committed["source"] != "published"].reset_index(drop=True)
    runs, records = collect_runs(config, RESULTS, grid=grid)
    if grid:  # every cell is either a run the report reads or named as missing
        missing = runs.attrs["missing_cells"]
        cells = len(config.grid.methods) * len(config.tasks) * len(config.grid.seeds)
        unfinished = int(missing.split(" of ")[0]) if missing else 0  # "N of M grid cells"
        assert len(runs) + unfinished == cells, missing
    bench = latest_bench(RESULTS, config.name)
    board = leaderboard(runs, config.tasks, efficiency=efficiency_table(bench),
                        teacher_shape=teacher_name(records),
                        teacher_params=teacher_parameters(records))
    stale = "reports/ is stale: regenerate it with `make report`"
    assert list(committed["label"]) == list(board["label"]), stale
    for column in COMPARED[2:] + config.tasks + [f"{task}_n" for task in config.tasks]:
        np.testing.assert_allclose(committed[column].to_numpy(float),
                                   board[column].to_numpy(float), rtol=1e-5, err_msg=stale)
    markdown = (folder / "leaderboard.md").read_text()
    for figure in re.findall(r"\]\((figures/[^)]+\.png)\)", markdown):
        assert (folder / figure).exists() and (folder / figure).with_suffix(".svg").exists()


def test_every_row_by_hand_from_the_record_files():
    """Every method row of the reference report recomputed from its JSON records alone:
    the mean of each task over the suite's seeds, and % of teacher where the row is
    complete (whatever part of the grid has landed)."""
    committed = pd.read_csv(REPO / "reports" / "glue-cpu" / "leaderboard.csv")
    config = load_suite("glue-cpu")
    rows = committed[(committed["source"] == "ours") & committed["label"].isin(config.methods)]
    assert len(rows) >= 1  # whatever part of the grid has landed
    for _, row in rows.iterrows():
        scores: dict[str, list[float]] = {}
        teacher: dict[str, float] = {}
        for path in (RESULTS / "glue-cpu" / row["label"]).glob("*/*.json"):
            record = json.loads(path.read_text())
            if (record["status"] == "finished" and not record.get("variation")
                    and record["seed"] in config.seeds):
                scores.setdefault(record["task"], []).append(record["main_score"])
                teacher[record["task"]] = record["teacher_main_score"]
        for task in config.tasks:
            if task in scores:
                assert row[task] == pytest.approx(np.mean(scores[task]), rel=1e-6), (
                    row["label"], task)
            else:
                assert pd.isna(row[task]), (row["label"], task)
        if set(scores) >= set(config.tasks):
            average = np.mean([np.mean(scores[task]) for task in config.tasks])
            teacher_average = np.mean([teacher[task] for task in config.tasks])
            assert row["average"] == pytest.approx(average, rel=1e-6)
            assert row["pct_of_teacher"] == pytest.approx(100 * average / teacher_average,
                                                          rel=1e-6)
        else:
            assert pd.isna(row["pct_of_teacher"])


@pytest.mark.slow
@pytest.mark.integration
def test_readme_leaderboard_is_the_grid_report():
    """The README's table is rewritten from the grid report by `make report`; a record that
    lands without it leaves the front page behind its own report.  (What
    `scripts/readme_leaderboard.py --check` compares, in this process.)"""
    spec = importlib.util.spec_from_file_location(
        "readme_leaderboard", REPO / "scripts" / "readme_leaderboard.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    readme = (REPO / "README.md").read_text()
    rewritten = script.rewritten(script.rewritten(readme, script.leaderboard_table()),
                                 script.ablation_table(), script.ABLATION)
    assert rewritten == readme, "README.md's tables are stale: run `make report`"


@pytest.mark.slow
@pytest.mark.integration
def test_every_general_checkpoint_of_the_committed_runs_was_read_in_one_build():
    """Runs that start from one general checkpoint (one cache key) compare from the same
    weights only if they read the same build of it: a row's seeds and tasks, and the rows
    that share tinybert's checkpoint. Every committed run of the suite, grid or not, with
    a general stage is counted; a cell re-run from another build fails here, as the
    report's warning names it."""
    _, records = collect_runs(load_suite("glue-cpu"), RESULTS, grid=False)
    started = {run_id: record for run_id, record in records.items()
               if (record.general_distillation or {}).get("key")}
    if not started:
        pytest.skip("no committed run of the current protocol starts from a general "
                    "checkpoint yet")
    builds = general_builds(started)
    assert all(len(found) == 1 for found in builds.values()), general_lines(builds)


@pytest.mark.slow
@pytest.mark.integration
def test_the_narrow_rows_of_the_grid_start_from_one_general_checkpoint():
    """kd and finetune on the narrow student start from tinybert's general checkpoint
    (``init_from: tinybert``), so that the narrow rows compare their task stages from the
    same weights: every cell of the three rows names one cache key. That they read one
    build of it is the test above's."""
    config = load_suite("glue-cpu")
    sharing = {"tinybert"} | {method for method in config.methods
                              if config.recipe(method).init_from == "tinybert"}
    assert {"kd", "finetune"} <= sharing
    _, records = collect_runs(config, RESULTS, grid=True)
    keys = [(record.general_distillation or {}).get("key") for record in records.values()
            if record.method in sharing]
    if not keys:
        pytest.skip("no committed grid cell of the narrow rows yet")
    assert len(set(keys)) == 1 and None not in keys, f"the narrow rows name {set(keys)}"


@pytest.mark.slow
@pytest.mark.integration
def test_a_committed_verdict_by_hand_from_the_committed_predictions():
    """The first paper ordering with a two-level comparison in reports/glue-cpu-grid/
    verdicts.csv, recomputed from the committed predictions files with numpy alone: per
    resample (seed 0, the suite's resamples) seeds then dev examples with replacement, the
    task metric on each drawn seed, the mean difference; its percentile interval and p."""
    from sklearn.metrics import f1_score, matthews_corrcoef

    from harness.reporting.verdicts import dev_labels

    config = load_suite("glue-cpu")
    verdicts = pd.read_csv(REPO / "reports" / "glue-cpu-grid" / "verdicts.csv")
    rows = verdicts[(verdicts["family"] == "paper orderings")
                    & (verdicts["p_source"] == "two-level")]
    if rows.empty:
        pytest.skip("no paper ordering has two rows with predictions on a task yet")
    row = rows.iloc[0]
    ids, labels = dev_labels(config, [row["task"]])[row["task"]]
    _, records = collect_runs(config, RESULTS, grid=True)

    def predicted(label: str) -> np.ndarray:
        runs = sorted((record.seed, record) for record in records.values()
                      if record.label() == label and record.task == row["task"])
        out = []
        for _, record in runs:
            path = next(RESULTS.glob(f"**/{record.predictions.file}"))
            with np.load(path, allow_pickle=False) as data:
                order = {example: i for i, example in enumerate(data["dev.ids"].tolist())}
                values = data["dev.values"][[order[example] for example in ids.tolist()]]
            out.append(values if values.ndim == 1 else values.argmax(axis=1))
        return np.stack(out)

    metric = {"f1": lambda p, y: 100 * f1_score(y, p),
              "accuracy": lambda p, y: 100 * np.mean(p == y),
              "matthews_correlation": lambda p, y: 100 * matthews_corrcoef(y, p),
              "pearson": lambda p, y: 100 * np.corrcoef(p, y)[0, 1]}[
        get_task_metric(row["task"])]
    a, b = predicted(row["a"]), predicted(row["b"])
    seeds, examples = a.shape
    draw = np.random.default_rng(config.verdicts.seed)
    differences = []
    for _ in range(config.verdicts.resamples):
        picked_seeds = draw.integers(0, seeds, seeds)
        picked = draw.integers(0, examples, examples)
        differences.append(np.mean([metric(a[s, picked], labels[picked])
                                    - metric(b[s, picked], labels[picked])
                                    for s in picked_seeds]))
    differences = np.array(differences)
    low, high = np.percentile(differences, [2.5, 97.5])
    resamples = len(differences)
    p = min(1.0, 2 * min((np.sum(differences <= 0) + 1) / (resamples + 1),
                         (np.sum(differences >= 0) + 1) / (resamples + 1)))
    assert (row["two_level_low"], row["two_level_high"]) == pytest.approx((low, high),
                                                                         abs=1e-5)
    assert row["p"] == pytest.approx(p, abs=1e-5)


def get_task_metric(task: str) -> str:
    from harness.data.tasks import get_task

    return get_task(task).main_metric
