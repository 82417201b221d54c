"""The report's figures: pure functions of pandas frames and dicts, each written as PNG and SVG.

Every plotting function takes ``out_dir`` and a file stem ``name``, writes
``<out_dir>/<name>.png`` and ``<out_dir>/<name>.svg`` and returns the written paths (an
empty list where there is nothing to plot: no rows, no history, no importances). Nothing
here reads the results store: the report builder prepares the frames.

Figures are built on :class:`matplotlib.figure.Figure` objects, not through pyplot, so none
is left registered (open) however many a report builds; the style (seaborn's
``whitegrid``) is applied in an ``rc_context`` and never leaks into the caller's settings.
Output is deterministic so that a regenerated report does not churn in git: a fixed SVG hash
salt, no dates in the metadata, text kept as text in the SVG (searchable, and smaller).

Figures (each ``plot_*`` writes what a ``*_figure`` function builds, which tests read back):

* :func:`plot_score_vs_cost`: score (the 5-task dev share of the teacher's margin, or the
  plain average) vs latency or parameters, each point's interval as an error bar, the
  Pareto front as a step line (:func:`pareto_front`), every point labelled (labels spread
  so that none overlap); :func:`average_intervals` gives the average's seed interval;
* :func:`plot_task_heatmap`: method x task, coloured by share of the teacher's margin on
  one scale for every column, the task's mean score printed, cells not above the baseline
  hatched (:func:`marked_cells`);
* :func:`plot_task_losses`: one task's final-stage training loss of every method, mean
  over seeds with the seeds' range as a band (:func:`final_stage_losses`);
* :func:`plot_ablation`: change vs the full model per ablated variant, ours (with the seed
  interval of :func:`ablation_intervals`) beside the paper's, one facet per table
  (procedure / objective / mapping);
* :func:`plot_optuna_history` and :func:`plot_param_importances`, for which
  :func:`study_from_history` and :func:`param_importances` rebuild an in-memory Optuna study
  from a tuned-parameters file's ``history``.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    MaxNLocator,
    NullLocator,
)

from harness.common.files import atomic_path
from harness.common.paths import contained
from harness.experiments.record import RunRecord

__all__ = [
    "MARK_NOTE",
    "METRIC_NAMES",
    "SHARE_LIMITS",
    "ablation_figure",
    "ablation_intervals",
    "average_intervals",
    "final_stage_losses",
    "heatmap_frames",
    "marked_cells",
    "metric_label",
    "param_importances",
    "pareto_front",
    "plot_ablation",
    "plot_optuna_history",
    "plot_param_importances",
    "plot_score_vs_cost",
    "plot_task_heatmap",
    "plot_task_losses",
    "row_names",
    "save",
    "score_axis",
    "score_vs_cost_figure",
    "study_from_history",
    "task_heatmap_figure",
    "task_losses_figure",
    "trials_frame",
]

DPI = 150

# Display names of the dev metrics (records keep them x100: percent for accuracy and F1,
# x100 for correlations).
METRIC_NAMES: dict[str, str] = {
    "accuracy": "accuracy",
    "f1": "F1",
    "matthews_correlation": "MCC",
    "pearson": "Pearson r",
    "spearmanr": "Spearman ρ",
    "combined_score": "combined",
}

_RC: dict[str, Any] = {
    "svg.hashsalt": "distill-bench-figures",  # stable clip-path ids
    "svg.fonttype": "none",  # text stays text: searchable, smaller, diffable
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "figure.titlesize": 12,
    "figure.titleweight": "bold",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
}


@contextmanager
def _style() -> Iterator[None]:
    rc = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook"), **_RC}
    with mpl.rc_context(rc):
        yield


def _figure(**kwargs: Any) -> Figure:
    """A figure outside pyplot (never registered, so never left open), on an Agg canvas so
    that text extents can be measured."""
    fig = Figure(layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``<out_dir>/<name>.png`` (150 dpi) and ``.svg`` (text kept as
    text, fixed hash salt, no date in the metadata), then release it (closed in pyplot if it
    was made there). Returns the two paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with mpl.rc_context(_RC):
        for suffix, metadata in ((".png", {"Software": None}), (".svg", {"Date": None})):
            path = contained(out_dir, f"{name}{suffix}")  # a name cannot lead elsewhere
            with atomic_path(path) as temporary:  # a failed write leaves the previous file
                fig.savefig(temporary, dpi=DPI, bbox_inches="tight", pad_inches=0.08,
                            metadata=metadata, facecolor="white")
            paths.append(path)
    if getattr(fig.canvas, "manager", None) is not None:  # made through pyplot: close it
        import matplotlib.pyplot as plt

        plt.close(fig)
    fig.clear()
    return paths


def metric_label(metric: str) -> str:
    return METRIC_NAMES.get(metric, metric)


def _signed(value: float, fmt: str) -> str:
    """``fmt`` applied to ``value`` with a typographic minus, as on the axes' ticks."""
    return fmt.format(value).replace("-", "\N{MINUS SIGN}")


# --------------------------------------------------------------------------- Pareto front


def pareto_front(frame: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The rows of ``frame`` that no other row dominates (lower ``x`` is better, higher
    ``y`` is better), sorted by ``x`` (then ``y`` descending).

    A row is dominated when another is at least as good on both and strictly better on
    one: identical rows are both kept; of rows with the same ``x`` only the highest ``y``
    stays. Rows with a missing ``x`` or ``y`` are never on the front.
    """
    valid = frame[frame[x].notna() & frame[y].notna()]
    xs = valid[x].to_numpy(dtype=float)
    ys = valid[y].to_numpy(dtype=float)
    no_worse = (xs[None, :] <= xs[:, None]) & (ys[None, :] >= ys[:, None])
    better = (xs[None, :] < xs[:, None]) | (ys[None, :] > ys[:, None])
    dominated = (no_worse & better).any(axis=1)
    front = valid[~dominated]
    return front.sort_values([x, y], ascending=[True, False], kind="stable")


# ------------------------------------------------------------------ from the leaderboard


def row_names(board: pd.DataFrame) -> list[str]:
    """A leaderboard's rows as the figures name them: ``label · student``, the teacher by
    its label alone."""
    teacher = (board["is_teacher"].fillna(False).astype(bool) if "is_teacher" in board
               else pd.Series(False, index=board.index))
    return [label if is_teacher else f"{label} · {student}" for label, student, is_teacher
            in zip(board["label"], board["student"], teacher, strict=True)]


def score_axis(board: pd.DataFrame, runs: pd.DataFrame, tasks: Sequence[str]
               ) -> tuple[pd.DataFrame, dict[str, str], str]:
    """What the score-vs-cost plots put on y, from a leaderboard (``board``) and its runs:
    the board with the columns used, the ``y``/``y_low``/``y_high``/``y_label`` arguments
    of :func:`plot_score_vs_cost` and a sentence for the caption.

    The cross-task aggregate ``dev_share_mean`` (the mean share of the teacher's margin
    over the baseline) with its bootstrap interval where the board has it for some student
    row (the teacher, 1 by definition, is set to 1 where missing); otherwise the plain
    ``average`` with its seed interval (:func:`average_intervals`)."""
    n = len(tasks)
    teacher = board["is_teacher"].fillna(False).astype(bool)
    if "dev_share_mean" in board and board.loc[~teacher, "dev_share_mean"].notna().any():
        data = board.copy()
        data.loc[teacher & data["dev_share_mean"].isna(), "dev_share_mean"] = 1.0
        return data, {"y": "dev_share_mean", "y_low": "dev_share_mean_low",
                      "y_high": "dev_share_mean_high",
                      "y_label": f"{n}-task dev: share of teacher margin"}, (
            f"{n}-task dev: mean over tasks of the share of the teacher's margin over the "
            "majority / mean baseline (0 = baseline, 1 = teacher), error bars its "
            "task-stratified bootstrap 95% interval")
    data = board.drop(columns=["average_low", "average_high"], errors="ignore").merge(
        average_intervals(runs, tasks), on=["label", "student"], how="left")
    data.index = board.index
    return data, {"y": "average", "y_low": "average_low", "y_high": "average_high",
                  "y_label": f"{n}-task dev: average score (0–100)"}, (
        f"{n}-task dev: plain average of the task scores, error bars the 95% t interval "
        "over seeds of each seed's average")


def heatmap_frames(board: pd.DataFrame, tasks: Sequence[str], baselines: dict[str, float],
                   names: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The ``scores``, ``shares`` and ``marked`` frames of :func:`plot_task_heatmap` from a
    leaderboard: rows :func:`row_names`, a column per task (``names[task]``) with its mean
    score and ``{task}_share``, and, where the board has ``dev_share_mean``, a column
    ``<n>-task dev`` holding that aggregate as both score and share. ``baselines`` (task ->
    majority / mean baseline) decide which cells are marked (:func:`marked_cells`; the
    aggregate's baseline is a share of 0, judged on ``dev_share_mean_high``). A board
    without ``{task}_share`` gets the share of its mean,
    (mean - baseline) / (teacher - baseline), the teacher being the ``is_teacher`` row."""
    from harness.reporting.comparisons import share_of_teacher_margin

    index = row_names(board)
    teacher = board[board["is_teacher"].fillna(False).astype(bool)]
    scores, shares, high, bases = {}, {}, {}, {}
    for task in tasks:
        column = names[task]
        scores[column] = board[task].to_numpy(dtype=float)
        if f"{task}_share" in board:
            shares[column] = board[f"{task}_share"].to_numpy(dtype=float)
        else:
            top = float(teacher[task].iloc[0]) if len(teacher) else math.nan
            shares[column] = share_of_teacher_margin(
                board[task].to_numpy(dtype=float), baselines.get(task, math.nan), top)[0]
        high[column] = board[f"{task}_ci_high"].to_numpy(dtype=float)
        bases[column] = baselines.get(task, math.nan)
    if "dev_share_mean" in board:
        column = f"{len(tasks)}-task dev"
        scores[column] = shares[column] = board["dev_share_mean"].to_numpy(dtype=float)
        high[column] = board.get("dev_share_mean_high", pd.Series(math.nan, board.index)
                                 ).to_numpy(dtype=float)
        bases[column] = 0.0
    frames = [pd.DataFrame(values, index=index) for values in (scores, shares, high)]
    return frames[0], frames[1], marked_cells(frames[1], frames[2], bases)


# ---------------------------------------------------------------------- label placement


def _spread_labels(ax: Any, xs: Sequence[float], ys: Sequence[float], texts: Sequence[str],
                   *, fontsize: float = 8.0, radius_pt: Sequence[float] | None = None,
                   segments: Sequence[tuple[float, float, float, float]] = (),
                   colours: Sequence[Any] | None = None) -> None:
    """Label every point with no label overlapping another label, a point or a segment.

    Labels are placed one by one, top to bottom, beside their point (left or right), each
    at the height nearest its point's that is free of the points' markers, the
    ``segments`` and the labels already placed; of the two sides the one needing the
    smaller shift wins (the side with more free room, up to the next point at about the
    same height or the axes edge, is preferred on a tie). A label that had to move is tied
    to its point by a thin leader line. Positions are worked out in display space, so the
    figure's layout is frozen first; labels stay inside the axes.

    ``radius_pt``: each marker's radius in points; ``segments``: line segments ``(x_from,
    y_from, x_to, y_to)`` in data coordinates that labels must not cross (the Pareto step
    line; their bounding boxes are avoided, so keep them horizontal or vertical);
    ``colours``: each label's text colour.
    """
    layout = _LabelLayout(ax, xs, ys, texts, fontsize, radius_pt, segments)
    layout.choose_sides()
    placed = layout.place()
    layout.draw(placed, xs, ys, texts, fontsize, colours)


class _LabelLayout:
    """The display-space geometry of :func:`_spread_labels`: the points, their labels'
    sizes, the obstacles (markers, segments, labels placed so far, as (left, right, bottom,
    top) in pixels) and the columns of points about the same x."""

    def __init__(self, ax: Any, xs: Sequence[float], ys: Sequence[float],
                 texts: Sequence[str], fontsize: float, radius_pt: Sequence[float] | None,
                 segments: Sequence[tuple[float, float, float, float]]) -> None:
        fig = ax.figure
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
        renderer = fig.canvas.get_renderer()
        self.ax, self.box = ax, ax.get_window_extent(renderer)
        self.points = ax.transData.transform(np.column_stack([xs, ys]).astype(float))
        n = len(texts)
        self.px_per_pt = fig.dpi / 72
        self.radius = np.asarray(radius_pt if radius_pt is not None else [4.0] * n,
                                 dtype=float) * self.px_per_pt
        self.pad = 1.5 * self.px_per_pt
        thick = 1.0 * self.px_per_pt
        self.obstacles = [(px - r, px + r, py - r, py + r)
                          for (px, py), r in zip(self.points, self.radius, strict=True)]
        for xa, ya, xb, yb in segments:
            (pa, qa), (pb, qb) = ax.transData.transform([(xa, ya), (xb, yb)])
            self.obstacles.append((min(pa, pb), max(pa, pb), min(qa, qb) - thick,
                                   max(qa, qb) + thick))
        self.widths, self.heights = np.zeros(n), np.zeros(n)
        for i, text in enumerate(texts):
            probe = ax.text(0, 0, text, fontsize=fontsize, transform=None)
            extent = probe.get_window_extent(renderer)
            probe.remove()
            self.widths[i], self.heights[i] = extent.width, extent.height
        self.gaps = self.radius + 3.0 * self.px_per_pt
        self.columns = self._columns()
        self.side = np.ones(n, dtype=bool)
        self.anchor = self.points[:, 0].copy()  # labels of a column align on its outer edge
        self.channel = np.zeros(n)

    def _columns(self) -> list[list[int]]:
        """Points about the same x, left to right: a column's labels go on one side."""
        points, radius = self.points, self.radius
        columns: list[list[int]] = []
        for k in sorted(range(len(points)), key=lambda k: (points[k, 0], k)):
            last = columns[-1][-1] if columns else None
            if last is not None and (points[k, 0] - points[last, 0]
                                     <= radius[k] + radius[last] + 3 * self.px_per_pt):
                columns[-1].append(k)
            else:
                columns.append([k])
        return columns

    def _room(self, column: list[int]) -> tuple[float, float]:
        """Free room right and left of a column, up to the next column overlapping it in
        height (or the axes edge)."""
        points, box = self.points, self.box
        c_x0, c_x1 = points[column, 0].min(), points[column, 0].max()
        c_y0, c_y1 = points[column, 1].min(), points[column, 1].max()
        band = 2.0 * self.heights[column].max()
        room_right, room_left = box.x1 - c_x1, c_x0 - box.x0
        for other in self.columns:
            if other is column:
                continue
            o_y0, o_y1 = points[other, 1].min(), points[other, 1].max()
            if o_y1 < c_y0 - band or o_y0 > c_y1 + band:
                continue
            o_x0, o_x1 = points[other, 0].min(), points[other, 0].max()
            if o_x0 > c_x1:
                room_right = min(room_right, o_x0 - c_x1)
            elif o_x1 < c_x0:
                room_left = min(room_left, c_x0 - o_x1)
        return room_right, room_left

    def choose_sides(self) -> None:
        """Each column's side: the one its widest label fits, else the roomier one."""
        for column in self.columns:
            room_right, room_left = self._room(column)
            need = float((self.gaps[column] + self.widths[column]).max())
            if (room_right >= need) != (room_left >= need):
                self.side[column] = room_right >= need
            else:
                self.side[column] = room_right >= room_left
            self.anchor[column] = (self.points[column, 0].max() if self.side[column[0]]
                                   else self.points[column, 0].min())
            if len(column) > 1:  # a stack: leave a channel for its leader lines
                self.channel[column] = 9.0 * self.px_per_pt

    def nearest_free(self, left: float, right: float, height: float, want: float,
                     skip: int, ceiling: float | None = None) -> float | None:
        """The label centre height nearest ``want`` at which a label spanning ``left`` to
        ``right`` touches no obstacle (but ``skip``, its own marker); None if none is."""
        pad, box = self.pad, self.box
        low, high = box.y0 + height / 2 + pad, box.y1 - height / 2 - pad
        if ceiling is not None:  # below the labels already stacked for this column
            high = min(high, ceiling - height / 2 - pad)
        blocked = sorted((b - height / 2 - pad, t + height / 2 + pad)
                         for k, (lft, rgt, b, t) in enumerate(self.obstacles)
                         if k != skip and lft < right + pad and rgt > left - pad)
        free, cursor = [], low  # complement of the blocked intervals within [low, high]
        for b, t in blocked:
            if b > cursor:
                free.append((cursor, min(b, high)))
            cursor = max(cursor, t)
        if cursor < high:
            free.append((cursor, high))
        candidates = [min(max(want, a), b) for a, b in free if b >= a]
        return min(candidates, key=lambda c: abs(c - want)) if candidates else None

    def _position(self, i: int, ceiling: float | None) -> tuple[float, float, bool]:
        """Label ``i``'s left edge, centre height and side: its column's side unless that
        has no room, at the free height nearest its point's."""
        px, py = self.points[i]
        width, height, gap = self.widths[i], self.heights[i], self.gaps[i]
        own = bool(self.side[i])
        for right in (own, not own):
            edge, off = (self.anchor[i], gap + self.channel[i]) if right == own else (px, gap)
            left_edge = edge + off if right else edge - off - width
            if left_edge < self.box.x0 or left_edge + width > self.box.x1:
                continue
            cy = self.nearest_free(left_edge, left_edge + width, height, py, skip=i,
                                   ceiling=ceiling if right == own else None)
            if cy is not None:
                return left_edge, cy, right
        off = gap + self.channel[i]  # nowhere free: beside the point, on its column's side
        return (self.anchor[i] + off if own else self.anchor[i] - off - width), py, own

    def place(self) -> dict[int, tuple[float, float, bool]]:
        """Every label's (left edge, centre height, right side), top to bottom; a column's
        labels keep its points' order, so leader lines never cross."""
        column_of = {k: number for number, column in enumerate(self.columns) for k in column}
        stack_bottom: dict[int, float] = {}
        placed: dict[int, tuple[float, float, bool]] = {}
        for i in sorted(range(len(self.points)), key=lambda k: (-self.points[k, 1], k)):
            left_edge, cy, right = self._position(i, stack_bottom.get(column_of[i]))
            placed[i] = (left_edge, cy, right)
            half = self.heights[i] / 2
            if right == self.side[i]:
                stack_bottom[column_of[i]] = min(stack_bottom.get(column_of[i], np.inf),
                                                 cy - half)
            self.obstacles.append((left_edge, left_edge + self.widths[i], cy - half, cy + half))
        return placed

    def draw(self, placed: dict[int, tuple[float, float, bool]], xs: Sequence[float],
             ys: Sequence[float], texts: Sequence[str], fontsize: float,
             colours: Sequence[Any] | None) -> None:
        """Annotate each point with its label; a moved label gets a leader line."""
        inverse = self.ax.transData.inverted()
        for i in sorted(placed):
            x0, cy, right = placed[i]
            near = x0 if right else x0 + self.widths[i]
            tx, ty = inverse.transform((near, cy))
            displaced = (abs(cy - self.points[i, 1]) > self.heights[i] * 0.6
                         or abs(near - self.points[i, 0]) > self.gaps[i] + 2 * self.px_per_pt)
            self.ax.annotate(
                texts[i], xy=(xs[i], ys[i]), xytext=(tx, ty), textcoords="data",
                ha="left" if right else "right", va="center", fontsize=fontsize,
                color=colours[i] if colours is not None else "0.15", zorder=5,
                arrowprops=(dict(arrowstyle="-", color="0.55", lw=0.6, shrinkA=1, shrinkB=3,
                                 relpos=(0.0, 0.5) if right else (1.0, 0.5))
                            if displaced else None),
            )


def _log_x(ax: Any, low: float, high: float) -> None:
    """Log-scale x axis over [low, high] with 1-2-5 ticks written as plain numbers (0.5, 1,
    2, 5, 10, ...)."""
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    axis = ax.xaxis
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1,
                                          math.ceil(math.log10(high)) + 1)
             for m in (1, 2, 5) if low <= m * 10.0 ** e <= high]
    if len(ticks) < 3:  # narrow range: add the in-between steps
        ticks = sorted({*ticks, *(m * 10.0 ** e
                                  for e in range(math.floor(math.log10(low)),
                                                 math.ceil(math.log10(high)) + 1)
                                  for m in (1.5, 3, 4, 7) if low <= m * 10.0 ** e <= high)})
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())


# --------------------------------------------------------------------- score vs cost


def plot_score_vs_cost(board: pd.DataFrame, x: str, out_dir: Path, name: str, *,
                       x_label: str, title: str, y: str = "average",
                       y_label: str = "GLUE average, dev (0–100)",
                       y_low: str | None = None, y_high: str | None = None,
                       hue: str = "student", hue_title: str = "student") -> list[Path]:
    """:func:`score_vs_cost_figure` written as ``<name>.png`` and ``.svg``; [] when no row
    has both ``x`` and ``y``."""
    fig = score_vs_cost_figure(board, x, x_label=x_label, title=title, y=y, y_label=y_label,
                               y_low=y_low, y_high=y_high, hue=hue, hue_title=hue_title)
    return save(fig, out_dir, name) if fig is not None else []


def score_vs_cost_figure(board: pd.DataFrame, x: str, *, x_label: str, title: str,
                         y: str = "average", y_label: str = "GLUE average, dev (0–100)",
                         y_low: str | None = None, y_high: str | None = None,
                         hue: str = "student", hue_title: str = "student") -> Figure | None:
    """Score against a cost (latency, parameters): one point per model, coloured by
    ``hue`` (student shape by default), the teacher a black star, the Pareto front (lower
    cost, higher score, on the points) a dashed step line, every point labelled with
    ``label``; where ``y_low`` and ``y_high`` name columns, each point's interval as an
    error bar (its line collection has the gid ``interval``; rows with a missing end have
    none).

    ``board``: columns ``label``, ``y`` (``average``), ``x``, ``hue`` and boolean
    ``is_teacher`` (optional). Rows with a missing ``x`` or ``y`` are left out (and off
    the front). The x axis is logarithmic where the costs span more than 10x.
    """
    data = board[board[x].notna() & board[y].notna()].copy()
    if data.empty:
        return None
    data["is_teacher"] = (data["is_teacher"].fillna(False).astype(bool)
                          if "is_teacher" in data else False)
    hue_values = data[hue].fillna("?").astype(str) if hue in data else pd.Series("?", data.index)
    data["_hue"] = hue_values
    students = data[~data["is_teacher"]]
    levels = list(dict.fromkeys(students["_hue"]))
    palette = dict(zip(levels, sns.color_palette("colorblind", max(len(levels), 1)),
                       strict=False))
    markers = dict(zip(levels, ["o", "s", "D", "^", "v", "P", "X", "h"] * 4, strict=False))

    with _style():
        fig = _figure(figsize=(9.5, 5.8))
        ax = fig.add_subplot()
        front = pareto_front(data, x, y)
        handles: list[Any] = []
        bars = _interval_bars(ax, data, x, y, y_low, y_high)
        if bars is not None:
            handles.append(bars)
        for level in levels:
            rows = students[students["_hue"] == level]
            handles.append(ax.scatter(rows[x], rows[y], s=55, color=palette[level],
                                      marker=markers[level], edgecolor="white",
                                      linewidth=0.8, zorder=3, label=level))
        teacher = data[data["is_teacher"]]
        if not teacher.empty:
            handles.append(ax.scatter(teacher[x], teacher[y], s=190, marker="*",
                                      color="black", zorder=4, label="teacher"))
        if len(front) >= 1:
            (line,) = ax.step(front[x], front[y], where="post", color="0.35", lw=1.3,
                              ls="--", zorder=2, label="Pareto front")
            ax.scatter(front[x], front[y], s=140, facecolor="none", edgecolor="0.35",
                       lw=1.0, zorder=2)
            handles.append(line)
        _cost_limits(ax, data, x, [y, *(c for c in (y_low, y_high) if c and c in data)])
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.set_title(title)
        ax.legend(handles=handles, title=hue_title, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
        labels = data["label"].astype(str) if "label" in data else data.index.astype(str)
        radius = np.where(data["is_teacher"], 8.0, 5.0)
        steps = []
        for (xa, ya), (xb, yb) in zip(front[[x, y]].to_numpy()[:-1],
                                      front[[x, y]].to_numpy()[1:], strict=True):
            steps += [(xa, ya, xb, ya), (xb, ya, xb, yb)]
        if bars is not None:  # labels keep off the error bars too
            steps += [(xa, ya, xb, yb) for (xa, ya), (xb, yb) in bars.lines[2][0].get_segments()]
        # label text in a darker shade of its point's colour, to tell apart neighbours
        colours = [(0.1, 0.1, 0.1) if teacher_row else
                   tuple(0.62 * c for c in palette[level])
                   for teacher_row, level in zip(data["is_teacher"], data["_hue"], strict=True)]
        _spread_labels(ax, data[x].tolist(), data[y].tolist(), labels.tolist(),
                       radius_pt=radius.tolist(), segments=steps, colours=colours)
        return fig


def _interval_bars(ax: Any, data: pd.DataFrame, x: str, y: str, low: str | None,
                   high: str | None) -> Any:
    """Vertical error bars from column ``low`` to column ``high`` at each row with both;
    the errorbar container (labelled for the legend), or None where there are none."""
    if not low or not high or low not in data or high not in data:
        return None
    rows = data[data[low].notna() & data[high].notna()]
    if rows.empty:
        return None
    below = (rows[y] - rows[low]).clip(lower=0).to_numpy(dtype=float)
    above = (rows[high] - rows[y]).clip(lower=0).to_numpy(dtype=float)
    bars = ax.errorbar(rows[x].to_numpy(dtype=float), rows[y].to_numpy(dtype=float),
                       yerr=[below, above], fmt="none", ecolor="0.45", elinewidth=1.0,
                       capsize=2.5, zorder=2.5, label="95% interval")
    bars.lines[2][0].set_gid("interval")
    return bars


def _cost_limits(ax: Any, data: pd.DataFrame, x: str, ys: list[str]) -> None:
    """x limits (logarithmic where the costs span more than 10x) and y limits with a margin
    around every value of the columns ``ys``."""
    low, high = float(data[x].min()), float(data[x].max())
    if low > 0 and high / low > 10:
        _log_x(ax, low / 10 ** 0.12, high * 10 ** 0.12)
    else:
        span = (high - low) or max(abs(high), 1.0)
        ax.set_xlim(low - 0.08 * span, high + 0.08 * span)
    values = data[ys].to_numpy(dtype=float)
    ylow, yhigh = float(np.nanmin(values)), float(np.nanmax(values))
    yspan = (yhigh - ylow) or 1.0
    ax.set_ylim(ylow - 0.12 * yspan, yhigh + 0.12 * yspan)


def average_intervals(runs: pd.DataFrame, tasks: Sequence[str], *,
                      confidence: float = 0.95) -> pd.DataFrame:
    """Per (``label``, ``student``) of ``runs`` (one row per run: ``task``, ``seed``,
    ``score``), the Student-t interval over seeds (ddof 1) of the average over ``tasks``:
    each seed's mean over the tasks, for the seeds that have every task. Columns
    ``label``, ``student``, ``average_low``, ``average_high`` (NaN under two seeds)."""
    from harness.reporting.stats import t_ci

    rows = []
    chosen = runs[runs["task"].isin(list(tasks))]
    for (label, student), group in chosen.groupby(["label", "student"], sort=False):
        per_seed = group.groupby(["seed", "task"])["score"].mean().unstack("task")
        per_seed = per_seed.reindex(columns=list(tasks)).dropna()
        low, high = t_ci(per_seed.mean(axis=1).to_numpy(dtype=float), confidence=confidence)
        rows.append({"label": label, "student": student, "average_low": low,
                     "average_high": high})
    return pd.DataFrame(rows, columns=["label", "student", "average_low", "average_high"])


# --------------------------------------------------------------------------- heatmap


SHARE_LIMITS = (-1.0, 1.0)
"""The heatmap's colour scale of the share of the teacher's margin, the same for every
column: 0 (the baseline) is white, 1 (the teacher) the deepest blue, shares below the
baseline red; values outside are clipped."""
MARK_NOTE = ("hatched: not above the baseline (the seed interval's upper end is at or below "
             "the task's majority / mean baseline, or the share is ≤ 0)")


def marked_cells(shares: pd.DataFrame, ci_high: pd.DataFrame,
                 baselines: dict[str, float]) -> pd.DataFrame:
    """The cells not above their baseline: share <= 0, or the upper end of the seed
    interval (``ci_high``, same shape) at or below the column's baseline (``baselines``,
    column -> value; a column without one is judged on its share alone). NaN compares as
    not marked."""
    base = pd.Series({c: baselines.get(c, np.nan) for c in ci_high.columns}, dtype=float)
    at_or_below = ci_high.astype(float).le(base, axis=1)
    return shares.astype(float).le(0.0) | at_or_below


def plot_task_heatmap(scores: pd.DataFrame, shares: pd.DataFrame, out_dir: Path, name: str, *,
                      title: str, marked: pd.DataFrame | None = None,
                      metric_labels: dict[str, str] | None = None,
                      formats: dict[str, str] | None = None,
                      separate: Sequence[str] = (),
                      reference: Sequence[str] = ()) -> list[Path]:
    """:func:`task_heatmap_figure` written as ``<name>.png`` and ``.svg``; [] when there
    are no scores."""
    fig = task_heatmap_figure(scores, shares, title=title, marked=marked,
                              metric_labels=metric_labels, formats=formats,
                              separate=separate, reference=reference)
    return save(fig, out_dir, name) if fig is not None else []


def task_heatmap_figure(scores: pd.DataFrame, shares: pd.DataFrame, *, title: str,
                        marked: pd.DataFrame | None = None,
                        metric_labels: dict[str, str] | None = None,
                        formats: dict[str, str] | None = None,
                        separate: Sequence[str] = (),
                        reference: Sequence[str] = ()) -> Figure | None:
    """Methods (rows) on tasks (columns): each cell coloured by its share of the teacher's
    margin over the baseline (``shares``, same index and columns as ``scores``) on one
    scale for every column (:data:`SHARE_LIMITS`, diverging at 0, clipped), so that a
    colour means the same in every column, and annotated with ``scores`` (one decimal, or
    ``formats[column]``; a dash where missing).

    ``marked`` (booleans, same shape; :func:`marked_cells`): cells hatched as not above the
    baseline (each hatch a patch with the gid ``not-above-baseline``), explained under the
    figure. ``metric_labels`` (column -> metric name) go under the column names; columns in
    ``separate`` (an aggregate) are set off by a gap. Rows in ``reference`` (the teacher,
    whose share is 1 by definition) are printed on a neutral background.
    """
    raw = scores.apply(pd.to_numeric, errors="coerce").astype(float)
    if raw.empty:
        return None
    is_reference = np.array([str(i) in {str(r) for r in reference} for i in raw.index])
    colour = shares.reindex(index=raw.index, columns=raw.columns).astype(float)
    colour = colour.clip(*SHARE_LIMITS).where(raw.notna())
    colour.loc[is_reference] = np.nan
    formats = formats or {}
    annot = pd.DataFrame({c: [("" if pd.isna(v) else _signed(v, formats.get(c, "{:.1f}")))
                              for v in raw[c]] for c in raw.columns}, index=raw.index)
    metric_labels = metric_labels or {}
    columns = [f"{c}\n{metric_labels[c]}" if c in metric_labels else str(c)
               for c in raw.columns]
    rows = [str(i) for i in raw.index]
    longest = max((len(r) for r in rows), default=10)

    with _style():
        fig = _figure(figsize=(2.6 + 0.068 * longest + 0.95 * len(columns),
                               1.9 + 0.36 * len(rows)))
        ax = fig.add_subplot()
        ax.set_facecolor("0.93")
        sns.heatmap(colour, ax=ax, annot=annot.to_numpy(), fmt="", cmap="RdBu",
                    vmin=SHARE_LIMITS[0], vmax=SHARE_LIMITS[1],
                    linewidths=0.6, linecolor="white", annot_kws={"fontsize": 9},
                    cbar_kws={"ticks": [SHARE_LIMITS[0], 0, SHARE_LIMITS[1]],
                              "shrink": 0.8 if len(rows) > 4 else 1.0, "aspect": 18})
        ax.grid(False)
        _share_colorbar(ax.collections[0].colorbar)
        _neutral_cells(ax, raw, annot, is_reference)
        _hatch(ax, marked.reindex(index=raw.index, columns=raw.columns)
               if marked is not None else None)
        for k, column in enumerate(raw.columns):
            if column in separate and k > 0:
                ax.axvline(k, color="white", lw=5)
        for i in range(1, len(rows)):
            if is_reference[i] != is_reference[i - 1]:
                ax.axhline(i, color="white", lw=5)
        ax.set_xticks(np.arange(len(columns)) + 0.5, columns, rotation=0)
        ax.set_yticks(np.arange(len(rows)) + 0.5, rows, rotation=0)
        for label, ref in zip(ax.get_yticklabels(), is_reference, strict=True):
            if ref:
                label.set_fontstyle("italic")
        ax.xaxis.tick_top()
        ax.tick_params(axis="both", length=0)
        ax.set_xlabel("")
        ax.set_ylabel("")
        ax.set_title(title, pad=8)
        if marked is not None and bool(marked.fillna(False).to_numpy(dtype=bool).any()):
            ax.annotate(textwrap.fill(MARK_NOTE, width=int(14 * fig.get_figwidth() * 0.7)),
                        xy=(0, 0), xycoords="axes fraction", xytext=(0, -6),
                        textcoords="offset points", ha="left", va="top", fontsize=8,
                        color="0.25")
        return fig


def _share_colorbar(colorbar: Any) -> None:
    low, high = SHARE_LIMITS
    colorbar.set_ticklabels([_signed(low, "≤ {:g}") + " (below)", "0 = baseline",
                             f"≥ {high:g} = teacher"])
    colorbar.ax.tick_params(labelsize=8)
    colorbar.set_label("colour: share of the teacher's margin", fontsize=9)


def _neutral_cells(ax: Any, raw: pd.DataFrame, annot: pd.DataFrame,
                   is_reference: np.ndarray) -> None:
    """The text of the cells seaborn leaves blank: a dash where there is no score, the
    score of a reference row (not coloured)."""
    for (i, j), value in np.ndenumerate(raw.to_numpy()):
        if np.isnan(value):
            ax.text(j + 0.5, i + 0.5, "–", ha="center", va="center", color="0.45",
                    fontsize=9)
        elif is_reference[i]:
            ax.text(j + 0.5, i + 0.5, annot.iat[i, j], ha="center", va="center",
                    color="0.15", fontsize=9)


def _hatch(ax: Any, marked: pd.DataFrame | None) -> None:
    if marked is None:
        return
    for (i, j), flag in np.ndenumerate(marked.fillna(False).to_numpy(dtype=bool)):
        if flag:
            ax.add_patch(mpl.patches.Rectangle(
                (j, i), 1, 1, fill=False, hatch="//", edgecolor="0.55", linewidth=0,
                zorder=1.5, gid="not-above-baseline"))


# ----------------------------------------------------------------------- loss curves

_HISTORY_META = ("step", "epoch", "lr", "loss")
_PERCENT_METRICS = ("accuracy", "f1")


def final_stage_losses(runs: Iterable[tuple[str, RunRecord]]) -> pd.DataFrame:
    """The training loss of each run's last stage with a history, in long form for
    :func:`plot_task_losses`: ``method`` (the name given with the record), ``seed``,
    ``stage``, ``step``, ``loss`` (the weighted total the optimiser minimised). Runs
    without a history give no rows."""
    rows = []
    for method, record in runs:
        stages = [stage for stage in record.stages if stage.history]
        if not stages:
            continue
        last = stages[-1]
        rows += [{"method": method, "seed": record.seed, "stage": last.name,
                  "step": entry["step"], "loss": entry.get("loss", math.nan)}
                 for entry in last.history]
    return pd.DataFrame(rows, columns=["method", "seed", "stage", "step", "loss"])


def plot_task_losses(curves: pd.DataFrame, out_dir: Path, name: str, *,
                     title: str) -> list[Path]:
    """:func:`task_losses_figure` written as ``<name>.png`` and ``.svg``; [] when there is
    no loss to draw."""
    fig = task_losses_figure(curves, title=title)
    return save(fig, out_dir, name) if fig is not None else []


def task_losses_figure(curves: pd.DataFrame, *, title: str) -> Figure | None:
    """Every method's final-stage training loss on one task: a line per method, the mean
    over its seeds at each optimiser step, and a band from the seeds' lowest to highest
    value (each band a collection with the gid ``seed-range``; a single seed has none).
    The y axis is logarithmic where the losses span more than 20x. Methods minimise
    different objectives, so the levels of two lines are not comparable, their shapes are.

    ``curves``: ``method``, ``seed``, ``step``, ``loss`` (:func:`final_stage_losses`);
    optionally ``stage`` (named in the legend).
    """
    data = curves[curves["loss"].notna()]
    if data.empty:
        return None
    methods = list(dict.fromkeys(data["method"]))
    palette = sns.color_palette("colorblind", 10)
    styles = ["-", "--", ":", "-."]
    with _style():
        fig = _figure(figsize=(9.5, 5.2))
        ax = fig.add_subplot()
        values = data["loss"].to_numpy(dtype=float)
        positive = values[np.isfinite(values) & (values > 0)]
        if positive.size == values.size and positive.max() / positive.min() > 20:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        for k, method in enumerate(methods):
            rows = data[data["method"] == method]
            by_step = rows.groupby("step")["loss"].agg(["mean", "min", "max", "count"])
            colour = palette[k % len(palette)]
            seeds = rows["seed"].nunique()
            stage = (f", {rows['stage'].iloc[0]}" if "stage" in rows
                     and rows["stage"].nunique() == 1 else "")
            ax.plot(by_step.index, by_step["mean"], color=colour, lw=1.6,
                    ls=styles[(k // len(palette)) % len(styles)],
                    label=f"{method} ({seeds} seed{'s' if seeds != 1 else ''}{stage})")
            if seeds > 1:
                band = ax.fill_between(by_step.index, by_step["min"], by_step["max"],
                                       color=colour, alpha=0.18, lw=0)
                band.set_gid("seed-range")
        ax.set_xlabel("optimiser step (final stage)")
        ax.set_ylabel("training loss, mean over seeds"
                      + (" (log scale)" if ax.get_yscale() == "log" else ""))
        ax.set_title(title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.set_xlim(left=0)
        ax.legend(title="method (band: lowest to highest seed)", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
        return fig


# -------------------------------------------------------------------------- ablation


def ablation_intervals(ablation: pd.DataFrame, scores: pd.DataFrame,
                       published: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """``ablation`` (the report's ablation frame: ``group``, ``variant``, ``source``,
    ``delta``) with ``delta_low`` and ``delta_high`` on our bars (``source`` starting with
    "ours"): the Student-t interval over seeds (scipy, ddof 1;
    :func:`~harness.reporting.comparisons.per_task_difference`) of the variant's mean over
    the table's tasks minus the full model's, paired by seed.

    ``scores``: our runs (``method``, ``task``, ``seed``, ``score``); ``published``: the
    published values (``group``, ``method``, ``task``, ``source_label``), whose ``average``
    rows list each table's methods, the full model first, and name its variants as the
    ablation frame does. Seeds and tasks are those every variant with runs shares with the
    full model (the ablation frame's); seeds missing one of those tasks are left out. A
    bar with fewer than two seeds, or whose seeds all differ by the same amount, gets none.
    """
    from harness.reporting.comparisons import per_task_difference

    result = ablation.assign(delta_low=np.nan, delta_high=np.nan)
    tables = published[(published["group"] != "") & (published["task"] == "average")]
    ours = result["source"].astype(str).str.startswith("ours")
    for group, listed in tables.groupby("group", sort=False):
        methods = list(dict.fromkeys(listed["method"]))
        full_label = str(listed["source_label"].iloc[0]).split(" (")[0]
        have = scores[scores["method"].isin(methods)]
        if methods[0] not in set(have["method"]):
            continue
        pairs = set.intersection(*(set(zip(runs["task"], runs["seed"], strict=True))
                                   for _, runs in have.groupby("method")))
        tasks = {task for task, _ in pairs}
        seeds = sorted(seed for seed in {s for _, s in pairs}
                       if all((task, seed) in pairs for task in tasks))
        keep = [(t, s) in pairs and s in seeds
                for t, s in zip(have["task"], have["seed"], strict=True)]
        means = (have[keep].groupby(["method", "task", "seed"])["score"].mean()
                 .groupby(["method", "seed"]).mean().unstack("seed"))
        for method in methods[1:]:
            if method not in means.index:
                continue
            label = str(listed.loc[listed["method"] == method, "source_label"].iloc[0])
            variant = label.replace(full_label, "").strip() or label
            change = per_task_difference(means.loc[method, seeds].to_numpy(dtype=float),
                                         means.loc[methods[0], seeds].to_numpy(dtype=float),
                                         confidence=confidence)
            at = ours & (result["group"] == group) & (result["variant"] == variant)
            result.loc[at, ["delta_low", "delta_high"]] = [change.low, change.high]
    return result


def plot_ablation(frame: pd.DataFrame, out_dir: Path, name: str, *, title: str,
                  full: str = "full",
                  y_label: str = "change vs full model (score points)") -> list[Path]:
    """:func:`ablation_figure` written as ``<name>.png`` and ``.svg``; [] when there is no
    variant besides the full model."""
    fig = ablation_figure(frame, title=title, full=full, y_label=y_label)
    return save(fig, out_dir, name) if fig is not None else []


def _ablation_data(frame: pd.DataFrame, full: str) -> tuple[pd.DataFrame, dict[str, float]]:
    """The variants' rows (``delta`` filled in as value minus the source's full model where
    it is missing; ``delta_low``/``delta_high`` NaN where absent) and each source's full
    model value."""
    data = frame.copy()
    sources = list(dict.fromkeys(data["source"]))
    fulls = {s: data.loc[(data["variant"] == full) & (data["source"] == s), "value"]
             for s in sources}
    full_value = {s: (float(v.iloc[0]) if len(v) else math.nan) for s, v in fulls.items()}
    for column in ("delta", "delta_low", "delta_high"):
        if column not in data:
            data[column] = np.nan
    computed = data["value"] - data["source"].map(full_value)
    data["delta"] = data["delta"].astype(float).fillna(computed)
    return data[data["variant"] != full], full_value


def ablation_figure(frame: pd.DataFrame, *, title: str, full: str = "full",
                    y_label: str = "change vs full model (score points)") -> Figure | None:
    """Ablations as the change against the full model: one facet per ``group`` (the
    paper's procedure / objective / mapping tables, shared y axis), one pair of bars per
    ``variant``: each ``source`` (ours, the paper's) beside the other, a zero line, each
    bar labelled with its change and, where ``delta_low`` and ``delta_high`` are given
    (:func:`ablation_intervals`), an error bar over that interval (a line collection with
    the gid ``interval``).

    ``frame``: ``group``, ``variant``, ``source``, ``value``; optionally ``delta`` (else
    computed as value minus the ``full`` variant's value in the same source). Our scores
    and the paper's are on different tasks, so only the changes are comparable; the full
    model's own value per source is given in the legend. A variant missing from a source
    shows "n/a" in that slot.
    """
    if frame.empty:
        return None
    sources = list(dict.fromkeys(frame["source"]))
    data, full_value = _ablation_data(frame, full)
    if data.empty:
        return None
    groups = list(dict.fromkeys(data["group"]))
    variants = {g: list(dict.fromkeys(data.loc[data["group"] == g, "variant"]))
                for g in groups}
    colours = dict(zip(sources, sns.color_palette("colorblind", len(sources)), strict=True))
    rotate = max(len(str(v)) for vs in variants.values() for v in vs) > 9
    ends = data[["delta", "delta_low", "delta_high"]].to_numpy(dtype=float)
    top = max(float(np.nanmax(ends)) if np.isfinite(ends).any() else 0.0, 0.0)
    bottom = min(float(np.nanmin(ends)) if np.isfinite(ends).any() else 0.0, 0.0)
    margin = 0.14 * ((top - bottom) or 1.0)

    with _style():
        n_bars = sum(len(v) for v in variants.values())
        fig = _figure(figsize=(max(6.5, 1.3 + 0.8 * n_bars + 0.5 * len(groups)), 4.9))
        axes = fig.subplots(1, len(groups), sharey=True, squeeze=False,
                            width_ratios=[max(len(variants[g]), 1.5) for g in groups])[0]
        for ax, group in zip(axes, groups, strict=True):
            rows = data[data["group"] == group]
            for k, source in enumerate(sources):
                offset = (k - (len(sources) - 1) / 2) * 0.8 / len(sources)
                _ablation_bars(ax, rows[rows["source"] == source], variants[group], offset,
                               0.8 / len(sources), colours[source], top - bottom)
            ax.axhline(0, color="0.2", lw=0.9, zorder=2)
            ax.set_xticks(range(len(variants[group])), [str(v) for v in variants[group]],
                          rotation=30 if rotate else 0, ha="right" if rotate else "center",
                          rotation_mode="anchor")
            ax.set_xlim(-0.6, len(variants[group]) - 0.4)
            ax.set_title(str(group))
            ax.grid(axis="x", visible=False)
        axes[0].set_ylabel(y_label)
        axes[0].set_ylim(bottom - margin, top + margin)
        handles = [mpl.patches.Patch(color=colours[s], label=(
            f"{s} (full model: {full_value[s]:.1f})" if not math.isnan(full_value[s]) else s))
            for s in sources]
        if data[["delta_low", "delta_high"]].notna().all(axis=1).any():
            handles.append(mpl.lines.Line2D([], [], color="0.2", lw=1.0, marker="_", ms=8,
                                            label="95% t interval over seeds"))
        fig.suptitle(title)
        fig.legend(handles=handles, loc="outside lower center",
                   ncol=min(len(handles), 3), frameon=False)
        return fig


def _ablation_bars(ax: Any, rows: pd.DataFrame, variants: list[str], offset: float,
                   width: float, colour: Any, span: float) -> None:
    """One source's bars in a facet: each variant's change at ``variant index + offset``
    with its label beyond the bar (or beyond its error bar), "n/a" where it has none."""
    xs, values, below, above = [], [], [], []
    for i, variant in enumerate(variants):
        cell = rows[rows["variant"] == variant]
        xpos = i + offset
        if cell.empty or pd.isna(cell["delta"].iloc[0]):
            ax.text(xpos, 0.01 * span, "n/a", ha="center", va="bottom", fontsize=7.5,
                    color="0.4", style="italic")
            continue
        value = float(cell["delta"].iloc[0])
        low, high = float(cell["delta_low"].iloc[0]), float(cell["delta_high"].iloc[0])
        ax.bar(xpos, value, width=width * 0.95, color=colour, edgecolor="white",
               linewidth=0.5, zorder=3)
        end = value
        if math.isfinite(low) and math.isfinite(high):
            xs.append(xpos)
            values.append(value)
            below.append(max(value - low, 0.0))
            above.append(max(high - value, 0.0))
            end = high if value >= 0 else low
        ax.text(xpos, end + (0.01 if value >= 0 else -0.01) * span,
                _signed(value, "{:+.1f}"), ha="center",
                va="bottom" if value >= 0 else "top", fontsize=7.5, zorder=4)
    if xs:
        bars = ax.errorbar(xs, values, yerr=[below, above], fmt="none", ecolor="0.2",
                           elinewidth=1.0, capsize=3, zorder=4)
        bars.lines[2][0].set_gid("interval")


# ------------------------------------------------------------------------------ Optuna

_STATE_STYLE = {
    "complete": {"marker": "o", "color": "#0173b2", "s": 42, "label": "complete"},
    "pruned": {"marker": "v", "color": "#de8f05", "s": 46,
               "label": "pruned (last reported value)"},
    "fail": {"marker": "X", "color": "#cc3311", "s": 50, "label": "failed (no value)"},
}


def plot_optuna_history(trials: pd.DataFrame, out_dir: Path, name: str, *, title: str,
                        direction: str = "maximize",
                        metric_label: str = "objective") -> list[Path]:
    """An Optuna study's optimisation history: each trial's value by state (complete,
    pruned at its last reported value, failed along the bottom edge, having none) and the
    best complete value so far as a step line.

    ``trials``: ``number``, ``state`` (complete / pruned / fail), ``value``.
    """
    if trials.empty:
        return []
    data = trials.sort_values("number", kind="stable")
    state = data["state"].astype(str).str.lower()
    with _style():
        fig = _figure(figsize=(8.0, 4.6))
        ax = fig.add_subplot()
        bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        for key, style in _STATE_STYLE.items():
            rows = data[state == key]
            if rows.empty:
                continue
            with_value = rows[rows["value"].notna()] if key != "fail" else rows.iloc[:0]
            without = rows[rows["value"].isna()] if key != "fail" else rows
            kwargs = {"marker": style["marker"], "color": style["color"], "s": style["s"],
                      "zorder": 3, "edgecolor": "white", "linewidth": 0.6}
            if not with_value.empty:
                ax.scatter(with_value["number"], with_value["value"], label=style["label"],
                           **kwargs)
            if not without.empty:
                ax.scatter(without["number"], np.full(len(without), 0.03), transform=bottom,
                           clip_on=False,
                           label=style["label"] if with_value.empty else None, **kwargs)
        complete = data[(state == "complete") & data["value"].notna()]
        if not complete.empty:
            best = (complete["value"].cummax() if direction == "maximize"
                    else complete["value"].cummin())
            xs = [*complete["number"], data["number"].max()]
            ys = [*best, best.iloc[-1]]
            best_at = int(complete.loc[complete["value"] == best.iloc[-1], "number"].iloc[0])
            ax.step(xs, ys, where="post", color="0.25", lw=1.6, zorder=2,
                    label=f"best so far\n(final {best.iloc[-1]:.4g}, trial {best_at})")
        ax.set_xlabel("trial number")
        ax.set_ylabel(f"{metric_label} ({'higher' if direction == 'maximize' else 'lower'}"
                      " is better)")
        ax.set_title(title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        valued = data["value"].dropna()
        if len(valued):
            lo, hi = float(valued.min()), float(valued.max())
            pad = max((hi - lo) * 0.12, abs(hi) * 0.002, 1e-3)
            ax.set_ylim(lo - pad * 1.6, hi + pad)
        ax.set_xlim(data["number"].min() - 0.6, data["number"].max() + 0.6)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  frameon=False)
        return save(fig, out_dir, name)


def plot_param_importances(importances: dict[str, float], out_dir: Path, name: str, *,
                           title: str,
                           x_label: str = "importance (fANOVA share of objective variance)"
                           ) -> list[Path]:
    """Hyperparameter importances as horizontal bars, the most important on top, each
    labelled with its value. Returns [] for no importances."""
    if not importances:
        return []
    items = sorted(importances.items(), key=lambda kv: (-kv[1], kv[0]))
    names = [k for k, _ in items]
    values = [v for _, v in items]
    with _style():
        fig = _figure(figsize=(7.0, 1.4 + 0.45 * len(items)))
        ax = fig.add_subplot()
        ypos = np.arange(len(items))
        ax.barh(ypos, values, color=sns.color_palette("colorblind")[0], height=0.6, zorder=3)
        for yv, value in zip(ypos, values, strict=True):
            ax.text(value, yv, f" {value:.2f}", va="center", ha="left", fontsize=9)
        ax.set_yticks(ypos, names)
        ax.invert_yaxis()
        ax.set_xlim(0, max(max(values), 1e-9) * 1.18)
        ax.set_xlabel(x_label)
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        return save(fig, out_dir, name)


def _distribution(values: list[Any]) -> Any:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    def is_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    def is_number(v: Any) -> bool:
        return is_int(v) or (isinstance(v, (float, np.floating)) and math.isfinite(v))

    if values and all(is_int(v) for v in values):
        return IntDistribution(int(min(values)), int(max(values)))
    if values and all(is_number(v) for v in values):
        low, high = float(min(values)), float(max(values))
        return FloatDistribution(low, high, log=low > 0 and high / low > 10)
    choices: list[Any] = []
    for value in values:
        if value not in choices:
            choices.append(value)
    return CategoricalDistribution(choices)


def study_from_history(history: list[dict[str, Any]], direction: str = "maximize") -> Any:
    """An in-memory Optuna study holding the trials of a tuned-parameters file's
    ``history`` (entries: ``trial``, ``state``, ``value``, ``params``, ``evaluations``).

    Distributions are inferred from the values seen per parameter: integers give an
    :class:`~optuna.distributions.IntDistribution`, other numbers a
    :class:`~optuna.distributions.FloatDistribution` (log scale where the values span more
    than 10x), anything else a categorical one. Complete trials carry their value, pruned
    trials theirs (Optuna's last reported intermediate value) and every trial its
    intermediate values (``evaluations``, at steps 0, 1, ...); failed trials have no value.
    Running or waiting entries are left out. Trials are added in ``trial`` order, so their
    numbers match where the history is complete; each keeps its original number in
    ``user_attrs["trial"]``.
    """
    import optuna
    from optuna.trial import TrialState, create_trial

    states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED,
              "fail": TrialState.FAIL}
    entries = sorted((e for e in history if str(e.get("state", "")).lower() in states),
                     key=lambda e: e.get("trial", 0))
    seen: dict[str, list[Any]] = {}
    for entry in entries:
        for key, value in (entry.get("params") or {}).items():
            seen.setdefault(key, []).append(value)
    distributions = {key: _distribution(values) for key, values in seen.items()}

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction=direction)
        trials = []
        for entry in entries:
            state = states[str(entry["state"]).lower()]
            value = entry.get("value")
            if value is not None and (state is TrialState.FAIL or not math.isfinite(value)):
                value = None
            if state is TrialState.COMPLETE and value is None:
                state = TrialState.FAIL
            params = dict(entry.get("params") or {})
            trials.append(create_trial(
                state=state, value=value, params=params,
                distributions={k: distributions[k] for k in params},
                intermediate_values={step: float(v)
                                     for step, v in enumerate(entry.get("evaluations") or [])
                                     if v is not None and math.isfinite(v)},
                user_attrs={"trial": entry.get("trial")},
            ))
        study.add_trials(trials)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return study


def param_importances(history: list[dict[str, Any]], direction: str = "maximize",
                      *, seed: int = 0) -> dict[str, float]:
    """fANOVA importances (normalised to sum to 1, seeded so they are reproducible) of the
    parameters that vary among the complete trials of ``history``.

    Returns {} where importance is undefined: fewer than two complete trials, no parameter
    varying among them, or the same value for every complete trial. Constant parameters
    (fixed by the search space or never moved) are left out.
    """
    import optuna
    from optuna.importance import FanovaImportanceEvaluator
    from optuna.trial import TrialState

    study = study_from_history(history, direction)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2 or len({t.value for t in complete}) < 2:
        return {}
    names = sorted({k for t in complete for k in t.params})
    common = [k for k in names if all(k in t.params for t in complete)]
    varied = [k for k in common if len({repr(t.params[k]) for t in complete}) > 1]
    if not varied:
        return {}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        result = optuna.importance.get_param_importances(
            study, evaluator=FanovaImportanceEvaluator(seed=seed), params=varied)
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
    finally:
        optuna.logging.set_verbosity(verbosity)
    if not result or not all(math.isfinite(v) for v in result.values()):
        return {}
    return {k: float(v) for k, v in result.items()}


def trials_frame(history: list[dict[str, Any]]) -> pd.DataFrame:
    """The ``trials`` frame of :func:`plot_optuna_history` from a tuned-parameters file's
    ``history``: ``number``, ``state``, ``value`` (NaN where there is none)."""
    rows = [{"number": e.get("trial"), "state": str(e.get("state", "")).lower(),
             "value": math.nan if e.get("value") is None else float(e["value"])}
            for e in history]
    return pd.DataFrame(rows, columns=["number", "state", "value"])


