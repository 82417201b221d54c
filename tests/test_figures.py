"""The report's figures (harness.reporting.figures): files written, text that reads, no leaked
figures, byte-identical regeneration, the Pareto front and the Optuna study rebuilt from a
history."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from itertools import combinations
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from harness.experiments.record import RunRecord
from harness.reporting import figures
from tests.records import run_record

SVG = "{http://www.w3.org/2000/svg}text"


@pytest.fixture(autouse=True)
def no_open_figures():
    plt.close("all")
    yield
    assert plt.get_fignums() == []


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # parses as XML
    return ["".join(node.itertext()) for node in root.iter(SVG)]


def check_written(paths: list[Path], out: Path, name: str, min_px: tuple[int, int]) -> list[str]:
    assert paths == [out / f"{name}.png", out / f"{name}.svg"]
    png, svg = paths
    assert png.stat().st_size > 5000 and svg.stat().st_size > 2000
    image = mpimg.imread(png)
    height, width = image.shape[:2]
    assert width >= min_px[0] and height >= min_px[1]
    assert width < 3000 and height < 3000
    dpi = Image.open(png).info["dpi"]
    assert dpi[0] == pytest.approx(figures.DPI, abs=1)
    return svg_texts(svg)


# ------------------------------------------------------------------------- Pareto front


def test_pareto_front_keeps_exactly_the_non_dominated_rows():
    frame = pd.DataFrame({
        "name": ["a", "b", "b2", "c", "d", "e", "f", "g", "h"],
        "cost": [1.0, 2.0, 2.0, 2.0, 3.0, 4.0, np.nan, 0.5, 5.0],
        "score": [50.0, 60.0, 60.0, 55.0, 58.0, 70.0, 99.0, np.nan, 70.0],
    })
    front = figures.pareto_front(frame, "cost", "score")
    # b and b2 tie (neither dominates the other); c has b's cost, lower score; d costs more
    # than b for less; h ties e's score at a higher cost; f and g have a missing value
    assert list(front["name"]) == ["a", "b", "b2", "e"]
    assert list(front["cost"]) == sorted(front["cost"])
    assert figures.pareto_front(frame.iloc[:0], "cost", "score").empty


# ------------------------------------------------------------------------ score vs cost


def board() -> pd.DataFrame:
    rows = [("finetune", "4L-192", 46.9, 7.78), ("kd", "4L-192", 47.4, 7.78),
            ("tinybert", "4L-192", 44.7, 7.78), ("tinybert-no-da", "4L-192", 47.3, 7.78),
            ("bert-pkd", "3L-384", 45.0, 17.4), ("kd-3L", "3L-384", 45.1, 17.4),
            ("distilbert", "3L-384", 44.5, 17.4), ("bilstm", "BiLSTM-150", 58.0, 0.57),
            ("bilstm-soft", "BiLSTM-150", 58.0, 0.57), ("no-size", "4L-192", 50.0, np.nan)]
    frame = pd.DataFrame(rows, columns=["method", "student", "average", "params_millions"])
    frame["label"] = frame["method"] + " · " + frame["student"]
    frame["is_teacher"] = False
    teacher = {"method": "teacher", "student": "MiniLM", "average": 65.7,
               "params_millions": 22.7, "label": "teacher · MiniLM-L6", "is_teacher": True}
    return pd.concat([frame, pd.DataFrame([teacher])], ignore_index=True)


def test_score_vs_cost_labels_every_point_and_draws_the_front(tmp_path):
    paths = figures.plot_score_vs_cost(board(), "params_millions", tmp_path, "cost",
                                       x_label="parameters (millions)", title="Score vs size")
    texts = check_written(paths, tmp_path, "cost", (1000, 600))
    for expected in ("parameters (millions)", "Score vs size", "kd · 4L-192",
                     "bilstm-soft · BiLSTM-150", "teacher · MiniLM-L6", "Pareto front",
                     "teacher", "4L-192", "3L-384", "BiLSTM-150"):
        assert expected in texts
    assert "no-size · 4L-192" not in texts  # no x: left out
    assert "10" in texts and "1" in texts  # log axis, plain-number ticks


def test_point_labels_do_not_overlap_each_other_or_the_points():
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    xs = [7.78] * 6 + [17.4] * 5 + [0.57, 0.57]
    ys = [47.0, 46.9, 46.8, 46.5, 44.7, 44.6, 45.0, 45.1, 44.5, 44.4, 38.0, 58.0, 58.0]
    texts = [f"method-{k} · shape" for k in range(len(xs))]
    with figures._style():
        fig = figures._figure(figsize=(9.5, 5.8))
        ax = fig.add_subplot()
        ax.scatter(xs, ys)
        ax.set_xscale("log")
        ax.set_xlim(0.4, 30)
        ax.set_ylim(35, 60)
        figures._spread_labels(ax, xs, ys, texts, radius_pt=[5.0] * len(xs))
        renderer = fig.canvas.get_renderer()
        # the text alone (an annotation's extent also covers its leader line)
        for text in ax.texts:
            text.update_positions(renderer)
        boxes = [Text.get_window_extent(text, renderer) for text in ax.texts]
        axes_box = ax.get_window_extent(renderer)
        points = ax.transData.transform(np.column_stack([xs, ys]))
    assert isinstance(fig, Figure) and len(boxes) == len(texts)
    for a, b in combinations(boxes, 2):
        assert not a.overlaps(b)
    radius = 5.0 * fig.dpi / 72
    for box in boxes:
        assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
        for px, py in points:  # no label covers a marker
            assert not (box.x0 < px + radius and px - radius < box.x1
                        and box.y0 < py + radius and py - radius < box.y1)


def test_stacked_labels_keep_their_points_order_beside_the_front_line():
    """Three close points at one x, the top one on a horizontal Pareto segment: their
    labels read top to bottom in the points' order (found wrong on the real leaderboard)."""
    from matplotlib.text import Text

    xs, ys = [4.75] * 3, [60.01, 59.53, 59.39]
    texts = ["top · A", "middle · B", "bottom · C"]
    with figures._style():
        fig = figures._figure(figsize=(9.5, 5.8))
        ax = fig.add_subplot()
        ax.scatter(xs, ys)
        ax.set_xscale("log")
        ax.set_xlim(3.5, 80)
        ax.set_ylim(35, 68)
        figures._spread_labels(ax, xs, ys, texts, radius_pt=[5.0] * 3,
                               segments=[(4.75, 60.01, 58.0, 60.01)])
        renderer = fig.canvas.get_renderer()
        for text in ax.texts:
            text.update_positions(renderer)
        heights = {text.get_text(): Text.get_window_extent(text, renderer).y0
                   for text in ax.texts}
    assert heights["top · A"] > heights["middle · B"] > heights["bottom · C"]


def test_score_vs_cost_with_nothing_to_plot_writes_nothing(tmp_path):
    frame = board().assign(params_millions=np.nan)
    assert figures.plot_score_vs_cost(frame, "params_millions", tmp_path, "none",
                                      x_label="x", title="t") == []
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ heatmap


def test_heatmap_annotates_raw_values_with_metric_labels(tmp_path):
    scores = pd.DataFrame(
        {"SST-2": [81.07, 80.6, 87.5], "MRPC": [81.3, np.nan, 86.1],
         "CoLA": [3.24, -0.46, 13.1], "average": [55.2, 40.07, 62.2]},
        index=["kd · 4L-192", "bert-pkd · 3L-384", "teacher"])
    paths = figures.plot_task_heatmap(scores, tmp_path, "heat", title="Dev scores",
                                      metric_labels={"MRPC": "F1", "CoLA": "MCC"},
                                      reference=["teacher"])
    texts = check_written(paths, tmp_path, "heat", (600, 250))
    for expected in ("81.1", "81.3", "3.2", "\N{MINUS SIGN}0.5", "40.1", "87.5", "13.1",
                     "–", "MRPC", "F1", "MCC", "SST-2", "average", "kd · 4L-192",
                     "teacher", "Dev scores", "lowest", "highest"):
        assert expected in texts
    assert any("relative within" in text for text in texts)


# -------------------------------------------------------------------------- loss curves


def stage(name: str, history: list[dict], evaluations: list[dict] | None = None) -> dict:
    return {"name": name, "steps": len(history), "examples_seen": 32 * len(history),
            "seconds": 1.0, "examples_per_second": 32.0, "history": history,
            "evaluations": evaluations or []}


def record(**fields) -> RunRecord:
    inter = [{"step": s, "epoch": s / 100, "lr": 1e-4, "attention": 12.0 - s / 20,
              "hidden": 0.8 - s / 1000, "embedding": 0.1, "loss": 12.9 - s / 20}
             for s in (25, 50, 75, 100)]
    pred = [{"step": s, "epoch": s / 100, "lr": 1e-4, "prediction": 0.7 - s / 2000,
             "loss": 0.7 - s / 2000} for s in (25, 50, 75, 100, 125, 150, 175, 200)]
    stages = [stage("general", []), stage("intermediate", inter),
              stage("prediction", pred, [{"step": 100, "epoch": 1, "f1": 80.1, "accuracy": 70.0},
                                         {"step": 200, "epoch": 2, "f1": 81.2,
                                          "accuracy": 71.0}])]
    return run_record(**{"method": "tinybert", "task": "mrpc", "task_display": "MRPC",
                         "seed": 1, "student_shape": "4L-192", "main_metric": "f1",
                         "stages": stages, **fields})


def test_loss_curves_one_panel_per_stage_with_history(tmp_path):
    paths = figures.plot_loss_curves(record(), tmp_path, "loss")
    texts = check_written(paths, tmp_path, "loss", (1000, 450))
    for expected in ("stage: intermediate", "stage: prediction", "attention", "hidden",
                     "embedding", "total (weighted)", "prediction (= total)",
                     "dev F1 (right axis)", "dev F1 (%)", "optimiser step",
                     "loss (log scale)"):
        assert expected in texts
    assert "stage: general" not in texts  # no history: no panel
    assert any("tinybert · MRPC · 4L-192 · seed 1" in text for text in texts)


def test_loss_curves_without_history_write_nothing(tmp_path):
    empty = record(stages=[stage("task", [])])
    assert figures.plot_loss_curves(empty, tmp_path, "none") == []


# ----------------------------------------------------------------------------- ablation


def test_ablation_plots_changes_ours_beside_the_papers(tmp_path):
    ours, paper = "ours: glue-cpu dev, STS-B", "paper: GLUE dev avg"
    frame = pd.DataFrame([
        ("procedure", "full", ours, 80.0), ("procedure", "full", paper, 75.6),
        ("procedure", "w/o GD", ours, 76.2), ("procedure", "w/o GD", paper, 72.5),
        ("procedure", "w/o DA", paper, 68.4),  # ours missing: an empty slot
        ("objective", "w/o Attn", ours, 84.2), ("objective", "w/o Attn", paper, 71.0),
    ], columns=["group", "variant", "source", "value"])
    paths = figures.plot_ablation(frame, tmp_path, "ablation", title="TinyBERT ablations")
    texts = check_written(paths, tmp_path, "ablation", (900, 450))
    for expected in ("procedure", "objective", "w/o GD", "w/o DA", "w/o Attn", "n/a",
                     "\N{MINUS SIGN}3.8", "\N{MINUS SIGN}3.1", "\N{MINUS SIGN}7.2", "+4.2",
                     "change vs full model (score points)", "TinyBERT ablations",
                     f"{ours} (full model: 80.0)", f"{paper} (full model: 75.6)"):
        assert expected in texts
    assert "full" not in texts  # the reference is the zero line, not a bar


def test_ablation_uses_given_deltas(tmp_path):
    frame = pd.DataFrame({"group": ["g", "g"], "variant": ["full", "v"],
                          "source": ["ours", "ours"], "value": [10.0, 12.0],
                          "delta": [0.0, 5.0]})
    texts = svg_texts(figures.plot_ablation(frame, tmp_path, "delta", title="t")[1])
    assert "+5.0" in texts and "+2.0" not in texts


# ------------------------------------------------------------------------------- Optuna

HISTORY = [
    {"trial": 0, "state": "complete", "value": 81.2,
     "params": {"alpha": 0.65, "temperature": 8.0, "lr": 9.0e-4, "layers": 4, "opt": "adam",
                "fixed": 1.0},
     "evaluations": [81.0, 81.2]},
    {"trial": 1, "state": "complete", "value": 80.1,
     "params": {"alpha": 0.23, "temperature": 2.0, "lr": 7.8e-5, "layers": 3, "opt": "sgd",
                "fixed": 1.0},
     "evaluations": [79.0, 80.1]},
    {"trial": 2, "state": "pruned", "value": 75.0,
     "params": {"alpha": 0.12, "temperature": 1.0, "lr": 4.5e-4, "layers": 2, "opt": "adam",
                "fixed": 1.0},
     "evaluations": [75.0]},
    {"trial": 3, "state": "fail", "value": None,
     "params": {"alpha": 0.5, "temperature": 4.0, "lr": 1.2e-5, "layers": 4, "opt": "sgd",
                "fixed": 1.0},
     "evaluations": []},
    {"trial": 4, "state": "complete", "value": 81.4,
     "params": {"alpha": 0.24, "temperature": 8.0, "lr": 2.0e-4, "layers": 2, "opt": "adam",
                "fixed": 1.0},
     "evaluations": [81.25, 81.4]},
    {"trial": 5, "state": "complete", "value": 79.5,
     "params": {"alpha": 0.84, "temperature": 4.0, "lr": 1.1e-4, "layers": 3, "opt": "sgd",
                "fixed": 1.0},
     "evaluations": [79.5, 79.5]},
]


def test_study_from_history_round_trips_states_values_and_params():
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )
    from optuna.trial import TrialState

    study = figures.study_from_history(HISTORY)
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == [e["trial"] for e in HISTORY]
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE,
                                         TrialState.PRUNED, TrialState.FAIL,
                                         TrialState.COMPLETE, TrialState.COMPLETE]
    assert [t.value for t in trials] == [e["value"] for e in HISTORY]
    assert [t.params for t in trials] == [e["params"] for e in HISTORY]
    assert trials[2].intermediate_values == {0: 75.0}
    assert trials[4].intermediate_values == {0: 81.25, 1: 81.4}
    assert study.best_trial.number == 4
    distributions = trials[0].distributions
    assert distributions["lr"] == FloatDistribution(1.2e-5, 9.0e-4, log=True)
    assert distributions["alpha"] == FloatDistribution(0.12, 0.84, log=False)
    assert distributions["layers"] == IntDistribution(2, 4)
    assert isinstance(distributions["opt"], CategoricalDistribution)
    assert set(distributions["opt"].choices) == {"adam", "sgd"}
    minimise = figures.study_from_history(HISTORY, direction="minimize")
    assert minimise.best_trial.number == 5


def test_param_importances_cover_the_varied_params_and_sum_to_one():
    importances = figures.param_importances(HISTORY)
    assert set(importances) == {"alpha", "temperature", "lr", "layers", "opt"}  # not fixed
    assert sum(importances.values()) == pytest.approx(1.0)
    assert all(value >= 0 for value in importances.values())
    assert figures.param_importances(HISTORY) == importances  # seeded: reproducible


def test_param_importances_empty_where_undefined():
    one_complete = [e for e in HISTORY if e["trial"] in (0, 2, 3)]
    assert figures.param_importances(one_complete) == {}
    same_value = [{**e, "value": 80.0} for e in HISTORY if e["state"] == "complete"]
    assert figures.param_importances(same_value) == {}
    same_params = [{**e, "params": {"a": 1.0}} for e in HISTORY if e["state"] == "complete"]
    assert figures.param_importances(same_params) == {}
    assert figures.param_importances([]) == {}


def test_optuna_history_and_importances_figures(tmp_path):
    trials = figures.trials_frame(HISTORY)
    assert list(trials["state"]) == [e["state"] for e in HISTORY]
    assert math.isnan(trials.loc[3, "value"])
    paths = figures.plot_optuna_history(trials, tmp_path, "history", title="Tuning kd",
                                        metric_label="dev F1")
    texts = check_written(paths, tmp_path, "history", (900, 450))
    for expected in ("complete", "pruned (last reported value)", "failed (no value)",
                     "trial number", "dev F1 (higher is better)", "Tuning kd"):
        assert expected in texts
    assert "best so far" in texts
    assert any("trial 4" in text for text in texts)

    importances = {"lr": 0.6, "alpha": 0.3, "temperature": 0.1}
    paths = figures.plot_param_importances(importances, tmp_path, "importances",
                                           title="Importances")
    texts = check_written(paths, tmp_path, "importances", (800, 300))
    for expected in ("lr", "alpha", "temperature", " 0.60", "Importances"):
        assert expected in texts
    assert figures.plot_param_importances({}, tmp_path, "none", title="t") == []


# ------------------------------------------------------------------------ reproducible


def test_regenerating_a_figure_gives_identical_files(tmp_path):
    first = figures.plot_score_vs_cost(board(), "params_millions", tmp_path / "a", "cost",
                                       x_label="parameters (millions)", title="t")
    second = figures.plot_score_vs_cost(board(), "params_millions", tmp_path / "b", "cost",
                                        x_label="parameters (millions)", title="t")
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
    svg = first[1].read_text()
    assert "<dc:date>" not in svg
    assert plt.rcParams["svg.hashsalt"] is None  # the style did not leak
