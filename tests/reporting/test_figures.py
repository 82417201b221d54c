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

from harness.config.published import load_published
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


def share_board() -> pd.DataFrame:
    """Three students and the teacher with the leaderboard's share columns (the teacher's
    aggregate missing: the plot sets it to 1)."""
    return pd.DataFrame({
        "label": ["teacher", "kd", "bilstm", "tinybert"],
        "student": ["MiniLM-L6", "4L-192", "BiLSTM-150", "4L-192"],
        "is_teacher": [True, False, False, False],
        "params_millions": [22.7, 7.78, 0.57, 7.78],
        "average": [70.0, 60.0, 58.0, 62.0],
        "dev_share_mean": [np.nan, 0.42, 0.31, 0.55],
        "dev_share_mean_low": [np.nan, 0.30, 0.12, 0.49],
        "dev_share_mean_high": [np.nan, 0.51, 0.40, 0.70],
    })


def interval_segments(ax) -> list[tuple[float, float, float]]:
    """The error bars drawn in ``ax`` (collections with the gid ``interval``) as sorted
    (x, low, high), in data coordinates, rounded to 6 decimals."""
    found = []
    for collection in ax.collections:
        if collection.get_gid() == "interval":
            for (xa, ya), (xb, yb) in collection.get_segments():
                assert xa == xb  # vertical
                found.append((round(float(xa), 6), round(float(min(ya, yb)), 6),
                              round(float(max(ya, yb)), 6)))
    return sorted(found)


def test_score_vs_cost_error_bars_are_the_share_interval_columns():
    board = share_board()
    data, axis, caption = figures.score_axis(board, pd.DataFrame(), ["mrpc", "rte"])
    assert axis == {"y": "dev_share_mean", "y_low": "dev_share_mean_low",
                    "y_high": "dev_share_mean_high",
                    "y_label": "2-task dev: share of teacher margin"}
    assert "bootstrap" in caption
    data["label"] = figures.row_names(data)
    fig = figures.score_vs_cost_figure(data, "params_millions", x_label="params",
                                       title="t", **axis)
    ax = fig.axes[0]
    # one bar per student row with an interval, none for the teacher
    assert interval_segments(ax) == [(0.57, 0.12, 0.40), (7.78, 0.30, 0.51),
                                     (7.78, 0.49, 0.70)]
    assert ax.get_ylabel() == "2-task dev: share of teacher margin"
    low, high = ax.get_ylim()
    assert low < 0.12 and high > 1.0  # every bar and the teacher (set to 1) inside
    teacher = next(c for c in ax.collections if c.get_label() == "teacher")
    assert teacher.get_offsets().tolist() == [[22.7, 1.0]]
    fig.clear()


def test_score_vs_cost_falls_back_to_the_average_with_its_seed_interval():
    from scipy import stats

    board = share_board().drop(columns=[c for c in share_board() if "share" in c])
    runs = pd.DataFrame(
        [("kd", "4L-192", task, seed, score) for task, scores in
         {"mrpc": [80.0, 82.0, 85.0], "rte": [55.0, 54.0, 58.0]}.items()
         for seed, score in enumerate(scores, start=1)]
        + [("bilstm", "BiLSTM-150", "mrpc", 1, 83.0), ("bilstm", "BiLSTM-150", "rte", 1, 57.0),
           ("bilstm", "BiLSTM-150", "mrpc", 2, 84.0)],  # seed 2 misses RTE: left out
        columns=["label", "student", "task", "seed", "score"])
    data, axis, caption = figures.score_axis(board, runs, ["mrpc", "rte"])
    assert axis["y"] == "average" and axis["y_label"] == "2-task dev: average score (0–100)"
    assert "t interval over seeds" in caption
    averages = np.array([67.5, 68.0, 71.5])  # each seed's mean over the two tasks
    half = stats.t.ppf(0.975, 2) * averages.std(ddof=1) / math.sqrt(3)
    kd = data.set_index("label").loc["kd"]
    assert kd["average_low"] == pytest.approx(averages.mean() - half)
    assert kd["average_high"] == pytest.approx(averages.mean() + half)
    assert data.set_index("label").loc["bilstm", ["average_low", "average_high"]].isna().all()
    data["average"] = [70.0, averages.mean(), 70.0, 62.0]
    fig = figures.score_vs_cost_figure(data, "params_millions", x_label="params",
                                       title="t", **axis)
    assert interval_segments(fig.axes[0]) == [
        (7.78, round(averages.mean() - half, 6), round(averages.mean() + half, 6))]
    fig.clear()


# ------------------------------------------------------------------------------ heatmap


def test_heatmap_annotates_raw_values_with_metric_labels(tmp_path):
    scores = pd.DataFrame(
        {"SST-2": [81.07, 80.6, 87.5], "MRPC": [81.3, np.nan, 86.1],
         "CoLA": [3.24, -0.46, 13.1], "2-task dev": [0.553, 0.401, 1.0]},
        index=["kd · 4L-192", "bert-pkd · 3L-384", "teacher"])
    shares = pd.DataFrame({"SST-2": [0.5, 0.4, 1.0], "MRPC": [0.2, np.nan, 1.0],
                           "CoLA": [0.25, -0.04, 1.0], "2-task dev": [0.553, 0.401, 1.0]},
                          index=scores.index)
    paths = figures.plot_task_heatmap(scores, shares, tmp_path, "heat", title="Dev scores",
                                      metric_labels={"MRPC": "F1", "CoLA": "MCC"},
                                      formats={"2-task dev": "{:.2f}"},
                                      separate=["2-task dev"], reference=["teacher"])
    texts = check_written(paths, tmp_path, "heat", (600, 250))
    for expected in ("81.1", "81.3", "3.2", "\N{MINUS SIGN}0.5", "0.55", "0.40", "87.5",
                     "13.1", "1.00", "–", "MRPC", "F1", "MCC", "SST-2", "2-task dev",
                     "kd · 4L-192", "teacher", "Dev scores", "0 = baseline", "≥ 1 = teacher",
                     "\N{MINUS SIGN}1 (below)".replace("\N{MINUS SIGN}", "≤ \N{MINUS SIGN}")):
        assert expected in texts
    assert any("share of the teacher's margin" in text for text in texts)
    assert not any("hatched" in text for text in texts)  # nothing marked: no note


def heat_cells(fig) -> tuple[np.ma.MaskedArray, np.ndarray]:
    """The heatmap's colour values and face colours, as (rows, columns) arrays."""
    ax = fig.axes[0]
    mesh = ax.collections[0]
    fig.draw_without_rendering()
    rows, columns = len(ax.get_yticks()), len(ax.get_xticks())
    return (mesh.get_array().reshape(rows, columns),
            np.asarray(mesh.get_facecolors()).reshape(rows, columns, 4))


def test_heatmap_colours_are_shares_on_one_scale_for_every_column():
    """A share of 0.5 has one colour in a column spread over [-0.3, 1] and in one spread
    over [0.5, 0.55]: no column is min-max scaled. Shares beyond 1 are clipped to 1;
    below the baseline is red, above it blue."""
    index = ["teacher", "a · S", "b · S", "c · S"]
    shares = pd.DataFrame({"SST-2": [1.0, 0.5, 0.1, -0.3], "MRPC": [1.0, 0.5, 0.55, 1.7]},
                          index=index)
    scores = pd.DataFrame({"SST-2": [90.0, 85.0, 83.0, 80.0],
                           "MRPC": [86.0, 83.6, 83.8, 90.0]}, index=index)
    fig = figures.task_heatmap_figure(scores, shares, title="t", reference=["teacher"])
    values, colours = heat_cells(fig)
    assert values.mask[0].all()  # the teacher is not coloured
    assert values[1:].tolist() == [[0.5, 0.5], [0.1, 0.55], [-0.3, 1.0]]
    assert colours[1, 0].tolist() == colours[1, 1].tolist()  # the same share, one colour
    assert colours[1, 0].tolist() != colours[2, 1].tolist()
    mesh = fig.axes[0].collections[0]
    assert colours[3, 1].tolist() == list(mesh.to_rgba(1.0))  # 1.7 clipped to the teacher
    below, above = colours[3, 0], colours[2, 1]
    assert below[0] > below[2] and above[2] > above[0]  # red under the baseline, blue over
    assert mesh.norm(0.0) == pytest.approx(0.5)  # the diverging scale's centre is 0
    fig.clear()


def test_heatmap_marks_exactly_the_cells_not_above_the_baseline():
    board = pd.DataFrame({
        "label": ["teacher", "a", "b", "c"], "student": ["T", "S", "S", "S"],
        "is_teacher": [True, False, False, False],
        "mrpc": [86.0, 83.0, 81.0, 81.2], "mrpc_share": [1.0, 0.375, -0.04, 0.0],
        "mrpc_ci_low": [86.0, 80.0, 80.0, 81.0], "mrpc_ci_high": [86.0, 86.0, 82.0, 81.4],
        # RTE: no teacher margin known, so no shares; judged on the seed interval alone
        "rte": [60.0, 55.0, 52.0, 53.5], "rte_share": [np.nan] * 4,
        "rte_ci_low": [60.0, 53.0, 50.0, 52.0], "rte_ci_high": [60.0, 57.0, 52.7, 55.0],
        "dev_share_mean": [1.0, 0.4, -0.05, 0.1],
        "dev_share_mean_high": [1.0, 0.6, 0.1, 0.3],
    })
    scores, shares, marked = figures.heatmap_frames(
        board, ["mrpc", "rte"], {"mrpc": 81.2, "rte": 52.7}, {"mrpc": "MRPC", "rte": "RTE"})
    assert list(scores.columns) == ["MRPC", "RTE", "2-task dev"]
    assert list(scores.index) == ["teacher", "a · S", "b · S", "c · S"]
    expected = {("b · S", "MRPC"), ("c · S", "MRPC"),  # share below and at 0
                ("b · S", "RTE"),  # the interval's top at the baseline
                ("b · S", "2-task dev")}  # the aggregate's share below 0
    assert {(r, c) for r in marked.index for c in marked.columns if marked.loc[r, c]} \
        == expected
    fig = figures.task_heatmap_figure(scores, shares, title="t", marked=marked,
                                      reference=["teacher"])
    ax = fig.axes[0]
    hatched = {(scores.index[int(p.get_y())], scores.columns[int(p.get_x())])
               for p in ax.patches if p.get_gid() == "not-above-baseline"}
    assert hatched == expected
    assert all(p.get_hatch() for p in ax.patches if p.get_gid() == "not-above-baseline")
    assert [t.get_text().replace("\n", " ") for t in ax.texts if "hatched" in t.get_text()] \
        == [figures.MARK_NOTE]
    fig.clear()


# -------------------------------------------------------------------------- loss curves


def stage(name: str, history: list[dict], evaluations: list[dict] | None = None) -> dict:
    return {"name": name, "steps": len(history), "examples_seen": 32 * len(history),
            "seconds": 1.0, "examples_per_second": 32.0, "history": history,
            "evaluations": evaluations or []}


def loss_record(method: str, seed: int, losses: list[float], **fields) -> RunRecord:
    """A run whose last stage with a history ("task", steps 10, 20, ...) has ``losses``."""
    task = [{"step": 10 * (k + 1), "epoch": k, "lr": 1e-4, "loss": value}
            for k, value in enumerate(losses)]
    general = [{"step": 5, "epoch": 0, "lr": 1e-4, "loss": 99.0}]
    return run_record(**{"method": method, "seed": seed, "stages": [
        stage("general", general), stage("task", task), stage("after", [])], **fields})


def test_task_losses_draw_each_methods_mean_over_seeds_with_its_range():
    runs = [("kd · 4L-192", loss_record("kd", 1, [1.0, 0.6, 0.4])),
            ("kd · 4L-192", loss_record("kd", 2, [1.2, 0.8, 0.2])),
            ("kd · 4L-192", loss_record("kd", 3, [0.8, 0.7, 0.3])),
            ("bilstm · BiLSTM-150", loss_record("bilstm", 1, [2.0, 1.5, 1.0])),
            ("empty", run_record(stages=[stage("task", [])]))]
    curves = figures.final_stage_losses(runs)
    assert set(curves["stage"]) == {"task"}  # the last stage with a history, nothing else
    assert len(curves) == 3 * 3 + 3 and 99.0 not in set(curves["loss"])
    fig = figures.task_losses_figure(curves, title="glue-cpu: training loss on MRPC")
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"kd · 4L-192 (3 seeds, task)", "bilstm · BiLSTM-150 (1 seed, task)"}
    kd = lines["kd · 4L-192 (3 seeds, task)"]
    assert kd.get_xdata().tolist() == [10, 20, 30]
    assert kd.get_ydata() == pytest.approx([1.0, 0.7, 0.3])
    bands = [c for c in ax.collections if c.get_gid() == "seed-range"]
    assert len(bands) == 1  # one seed: no band
    vertices = bands[0].get_paths()[0].vertices
    for step, low, high in ((10, 0.8, 1.2), (20, 0.6, 0.8), (30, 0.2, 0.4)):
        ys = vertices[np.isclose(vertices[:, 0], step), 1]
        assert ys.min() == pytest.approx(low) and ys.max() == pytest.approx(high)
    fig.clear()
    assert figures.plot_task_losses(curves.iloc[:0], Path("."), "none", title="t") == []


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


def test_ablation_error_bars_are_the_seed_t_interval_of_the_change():
    """Our change for w/o GD has the paired t interval over seeds (scipy, ddof 1) of the
    variant's mean over the tasks minus the full model's; the paper's bars have none, nor
    has a variant with a single seed."""
    from scipy import stats

    full = {("mrpc", 1): 80.0, ("mrpc", 2): 82.0, ("mrpc", 3): 81.0,
            ("rte", 1): 60.0, ("rte", 2): 58.0, ("rte", 3): 62.0}
    no_gd = {("mrpc", 1): 76.0, ("mrpc", 2): 79.0, ("mrpc", 3): 75.0,
             ("rte", 1): 59.0, ("rte", 2): 55.0, ("rte", 3): 58.0}
    rows = [(method, task, seed, score) for method, scores in
            (("tinybert", full), ("tinybert-no-gd", no_gd)) for (task, seed), score in
            scores.items()]
    rows.append(("tinybert-top", "mrpc", 1, 70.0))  # one seed, one task
    scores = pd.DataFrame(rows, columns=["method", "task", "seed", "score"])
    ours, paper = "ours: glue-cpu dev, MRPC, RTE", "paper: GLUE dev"
    frame = pd.DataFrame([
        ("procedure", "full", ours, 70.5, 0.0), ("procedure", "full", paper, 75.6, 0.0),
        ("procedure", "w/o GD", ours, 67.0, -3.5), ("procedure", "w/o GD", paper, 72.5, -3.1),
        ("mapping", "full", ours, 80.0, 0.0), ("mapping", "top", ours, 70.0, -10.0),
    ], columns=["group", "variant", "source", "value", "delta"])
    result = figures.ablation_intervals(frame, scores, load_published())
    per_seed = np.array([(76 + 59) / 2 - (80 + 60) / 2, (79 + 55) / 2 - (82 + 58) / 2,
                         (75 + 58) / 2 - (81 + 62) / 2])
    half = stats.t.ppf(0.975, 2) * per_seed.std(ddof=1) / math.sqrt(3)
    row = result[(result["variant"] == "w/o GD") & (result["source"] == ours)].iloc[0]
    assert (row["delta_low"], row["delta_high"]) == pytest.approx(
        (per_seed.mean() - half, per_seed.mean() + half))
    with_interval = result[result["delta_low"].notna()]
    assert list(with_interval["variant"]) == ["w/o GD"]  # not the paper's, not "top"

    fig = figures.ablation_figure(result, title="TinyBERT ablations")
    drawn = [interval_segments(ax) for ax in fig.axes]
    assert [len(bars) for bars in drawn] == [1, 0]  # procedure: ours; mapping: none
    (_, low, high), = drawn[0]
    assert (low, high) == pytest.approx((row["delta_low"], row["delta_high"]), abs=1e-6)
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert "95% t interval over seeds" in labels
    fig.clear()


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


@pytest.mark.slow
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


# ------------------------------------------------------------------- the report's figures


@pytest.mark.slow
def test_report_figures_one_loss_figure_per_task_and_intervals_on_the_ablation(tmp_path):
    """make_figures on a small store: score-vs-parameters, the heatmap, one loss-curve file
    per task holding every complete row (the partial finetune row left out), the ablation
    with its seed interval; nothing per run."""
    from harness.experiments.store import ResultsStore
    from harness.reporting.report import (
        ReportInputs,
        collect_runs,
        leaderboard,
        make_figures,
    )
    from tests.reporting.test_report import SCORES, suite, write_record

    results = tmp_path / "results"
    store = ResultsStore(results)
    ablation = {("tinybert", "4L-192"): {"mrpc": [84.0, 83.0, 85.0], "rte": [56.0, 57.0, 55.0]},
                ("tinybert-no-gd", "4L-192"): {"mrpc": [82.0, 82.5, 81.0],
                                               "rte": [54.0, 56.0, 53.0]}}
    for (method, student), tasks in {**SCORES, **ablation}.items():
        for task, scores in tasks.items():
            for seed, score in enumerate(scores, start=1):
                write_record(store, method, student, task, seed, score)
    config = suite()
    runs, records = collect_runs(config, results, log=lambda _: None)
    inputs = ReportInputs(config=config, runs=runs, records=records,
                          board=leaderboard(runs, config.tasks), anchors=load_published(),
                          published=pd.DataFrame(), bench=None, comparisons=pd.DataFrame(),
                          claims=[])
    made = make_figures(inputs, results, tmp_path / "out", log=lambda _: None)
    names = sorted(png.stem for _, png in made)
    assert names == ["curves-mrpc", "curves-rte", "score-vs-parameters", "task-heatmap",
                     "tinybert-ablation"]
    written = sorted(path.name for path in (tmp_path / "out" / "figures").iterdir())
    assert written == sorted(f"{name}{suffix}" for name in names for suffix in (".png", ".svg"))
    captions = dict((png.stem, caption) for caption, png in made)
    assert "t interval over seeds of the change" in captions["tinybert-ablation"]
    # the heading is the title of the suite that lists the ablation tables
    assert captions["tinybert-ablation"].startswith("TinyBERT ablations: change against")
    assert "share of the teacher's margin" in captions["task-heatmap"]
    texts = svg_texts(tmp_path / "out" / "figures" / "curves-rte.svg")
    for row in ("kd · 4L-192", "bilstm · BiLSTM-150", "tinybert · 4L-192",
                "tinybert-no-gd · 4L-192"):
        assert any(text.startswith(f"{row} (3 seeds") for text in texts)
    assert not any(text.startswith("finetune") for text in texts)
