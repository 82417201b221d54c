"""The common grid: methods x variants x student shapes x tasks x seeds, on equal budgets.

A suite's ``grid:`` section declares the cells and the fairness rule (``budget``: training
examples seen over the task stages, and the tuning trials every method gets).  The grid is
a queue on an Optuna relational storage (SQLite beside the results by default, PostgreSQL
or MySQL for many machines): one trial per cell, enqueued once, popped atomically by
whichever worker asks next, so several workers never run the same cell and a dead
worker's cell is failed by the heartbeat check and re-queued.  Cells are runs of the
results store, identified by the hash of their resolved configuration: a cell whose
record exists is not trained again, whichever worker, machine or `harness run` made it.
Whether a cell is done is the store's answer, not its trial's: a worker starting on a
queue first queues again every cell that has neither a record nor a waiting or running
trial (one stopped by Ctrl-C or an exception, which Optuna fails and never retries).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.api.registry import registry
from harness.assets.checkpoints import TeacherError
from harness.common.cache import content_hash
from harness.config.identity import LATER_TRAIN_FIELDS
from harness.config.schema import (
    ConfigError,
    GridConfig,
    SuiteConfig,
    student_kind,
)
from harness.experiments.planner import CellPlan, Variation, task_problem
from harness.experiments.provenance import code_change
from harness.experiments.record import RunRecord
from harness.experiments.runner import RunOutcome, SuiteRunner
from harness.experiments.storage import MAX_RETRIES, mask_url, open_storage
from harness.experiments.store import (
    InvalidRecordError,
    ResultsStore,
    StoreNotWritableError,
)
from harness.experiments.tracking import Tracking
from harness.experiments.tuning import (
    STOPPING_ERRORS,
    TrialFailed,
    TunedParams,
    Tuner,
    TuningTarget,
    UnexpectedError,
    fail_dead_local_trials,
    failed_run,
    load_tuned,
    quiet_reported_failures,
    retried_trials,
    tuned_path,
    worker_id,
)
from harness.training.distributed import broadcast


@dataclass(frozen=True)
class GridCell:
    method: str
    task: str
    seed: int
    student: str | None = None
    """A student shape other than the method's own (None: its own)."""
    task_epochs: float | None = None

    @property
    def row(self) -> str:
        """The leaderboard row the cell's run fills: the method, and a student shape other
        than its own in brackets."""
        return self.method + (f" [{self.student}]" if self.student else "")

    @property
    def label(self) -> str:
        return f"{self.row} / {self.task} / seed {self.seed}"

    def target(self, seeds: list[int]) -> TuningTarget:
        return TuningTarget(self.method, self.task, seeds, self.student, self.task_epochs)


def grid_of(suite: SuiteConfig) -> GridConfig:
    if suite.grid is None:
        raise ConfigError(f"suite {suite.name} declares no grid: add a `grid:` section "
                          "(methods, seeds, budget) to its file")
    return suite.grid


def grid_cells(suite: SuiteConfig, methods: list[str] | None = None,
               tasks: list[str] | None = None, seeds: list[int] | None = None,
               log: Callable[[str], None] | None = None) -> list[GridCell]:
    """The cells, task by task (each task's data and teacher are prepared once).  A method
    that does not apply to a task (:meth:`~harness.api.Method.task_problem`) has no cells
    there; ``log`` names it."""
    grid = grid_of(suite)
    method_names = methods or grid.recipes
    cells = []
    for task in tasks or grid.tasks or suite.tasks:
        for method in method_names:
            if (why := task_problem(suite, method, task)) is not None:
                if log is not None:
                    log(f"[n/a] {method} on {task}: {why}; left out")
                continue
            epochs = grid.budget.epochs_for(task, method)
            plugin = registry.get(suite.plugin(method))
            own, _ = suite.student_for(method)
            fitting = [name for name in grid.students
                       if student_kind(suite.students[name]) in plugin.student_kinds]
            for student in fitting or [own]:
                for seed in seeds or grid.seeds or suite.seeds:
                    cells.append(GridCell(method, task, seed,
                                          None if student == own else student, epochs))
    # A method, task or seed named twice (-m kd -m kd) is one cell, planned and counted once.
    return list(dict.fromkeys(cells))


@dataclass
class PlannedCell:
    cell: GridCell
    run_id: str | None
    status: str
    """done, failed, todo, or tune (its parameters come from a study not finished yet)."""
    task_epochs: float
    examples: int
    estimate: float | None
    """Seconds, from the throughput of earlier records of the same method, task and
    student (else the same task and student), plus their fixed overhead."""


@dataclass
class CostModel:
    """Seconds per budget example (task epochs x training rows, the grid's budget unit) and
    per-run overhead, from the records on disk. Priced per budget example, not per example
    seen, a method's augmented copies enter its estimate as they entered its earlier runs'
    time; only runs trained by the same budget rules (:func:`budget_rules`) price a cell,
    so a smoke run capped at a few steps does not."""

    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_store(cls, root: Path) -> CostModel:
        rows = []
        for record in ResultsStore(root).records():
            examples = budget_examples(record)
            if not record.finished or not examples or record.train_seconds is None \
                    or record.wall_seconds is None:
                continue
            rows.append({"method": record.method, "plugin": record.plugin,
                         "task": record.task, "student": record.student_shape,
                         "rules": budget_rules(task_stage_configs(record)),
                         "per_example": record.train_seconds / examples,
                         "overhead": record.wall_seconds - record.train_seconds})
        return cls(rows)

    def estimate(self, method: str, plugin: str, task: str, student: str, examples: int,
                 rules: tuple[tuple[Any, ...], ...]) -> float | None:
        for match in ({"method": method, "task": task, "student": student},
                      {"plugin": plugin, "task": task, "student": student},
                      {"task": task, "student": student}):
            rows = [row for row in self.records if row["rules"] == rules
                    and all(row[key] == value for key, value in match.items())]
            if rows:
                return (examples * statistics.median(row["per_example"] for row in rows)
                        + statistics.median(row["overhead"] for row in rows))
        return None


def task_stage_configs(record: RunRecord) -> list[dict[str, Any]]:
    """The training configurations (:meth:`TrainConfig.identity`) of a record's task
    stages, in order."""
    stages = record.config.get("stages", {})
    return [stages.get(stage.name, {}) for stage in record.stages]


def budget_rules(stage_configs: list[dict[str, Any]]) -> tuple[tuple[Any, ...], ...]:
    """Per task stage (its :meth:`TrainConfig.identity`), what sets its training besides its
    epochs: a step cap, and whether an epoch of augmented data is the task's size or the
    augmented set's (``epoch_size``, the recipe's own on stages without augmented data,
    alike in its runs and its cells)."""
    return tuple((config.get("max_steps"),
                  config.get("epoch_size", LATER_TRAIN_FIELDS["epoch_size"]))
                 for config in stage_configs)


def budget_examples(record: RunRecord) -> float | None:
    """A record's task-stage epochs times its training rows (the grid's budget unit)."""
    epochs = [config.get("epochs") for config in task_stage_configs(record)]
    if not epochs or None in epochs or not record.data.train_examples:
        return None
    return sum(epochs) * record.data.train_examples


class Grid:
    """Plans and works through a suite's grid on an Optuna storage."""

    def __init__(self, suite: SuiteConfig, results: Path, storage_url: str,
                 cache_dir: Path | None = None, log: Callable[[str], None] = print,
                 methods: list[str] | None = None, tasks: list[str] | None = None,
                 seeds: list[int] | None = None, poll_seconds: float | None = None,
                 reclaim_local: bool = True, tuned: list[TunedParams] | None = None,
                 tracking: Tracking | None = None,
                 precision: dict[str, str] | None = None, retry_failed: bool = False) -> None:
        """``retry_failed``: train again the cells whose runs failed (a non-finite loss,
        say); otherwise a failed record is the cell's result.
        ``reclaim_local``: fail a dead local worker's running cell at once (see
        :func:`fail_dead_local_trials`) instead of after the heartbeat grace period.
        ``tuned``: parameter files (``--params``) for the cells of their method and task,
        in place of the grid's own tuning.  ``tracking``: experiment trackers for every
        run the grid trains, its tuning trials' included.  ``precision``: what the
        suite's ``auto`` precisions resolve to (default: this machine's CPU flags)."""
        self.suite = suite
        self.config = grid_of(suite)
        self.results = results
        self.storage_url = storage_url
        self.cache_dir = cache_dir
        self.log = log
        self.cells = grid_cells(suite, methods, tasks, seeds, log)
        self.poll_seconds = poll_seconds
        self.reclaim_local = reclaim_local
        self.tracking = tracking
        self.runner = SuiteRunner(suite, results, cache_dir, log=log, tracking=tracking,
                                  retry_failed=retry_failed,
                                  precision=precision)
        # By method, task and the student tuned on (None: any of the method's students):
        # a grid that crosses students takes one file per shape.
        self.tuned: dict[tuple[str, str, str | None], TunedParams] = {}
        for params in tuned or []:
            if params.suite and params.suite != suite.record_suite:
                raise ConfigError(f"{params.path}: tuned on suite {params.suite!r}, not "
                                  f"{suite.record_suite!r}")
            cells = [cell for cell in self.cells
                     if (cell.method, cell.task) == (params.method, params.task)]
            if not cells:
                raise ConfigError(f"{params.path}: parameters for {params.method} on "
                                  f"{params.task}, which is not a cell of this grid")
            students = {self._student(cell) for cell in cells}
            if params.student is not None and params.student not in students:
                raise ConfigError(f"{params.path}: tuned on student {params.student!r}; this "
                                  f"grid's {params.method} cells on {params.task} train "
                                  f"{', '.join(sorted(students))}")
            # A file that names no student was tuned on the method's own (what `harness
            # tune` without --student and the grid's own study of such a cell write): it
            # shares the method's own cells only with a file naming that student.
            own, _ = self.suite.student_for(params.method)
            for (method, task, student), earlier in self.tuned.items():
                if (method, task) == (params.method, params.task) and (
                        (student or own) == (params.student or own)):
                    raise ConfigError(f"{params.path}: parameters for {params.method} on "
                                      f"{params.task}, as {earlier.path} is; pass one of them")
            self.tuned[params.method, params.task, params.student] = params
        self._tuners: dict[tuple, Tuner] = {}
        self._estimates: dict[GridCell, float | None] = {}
        self._run_ids: dict[GridCell, str | None] = {}
        self._recorded: set[GridCell] = set()

    # -- tuning ---------------------------------------------------------------------------
    @property
    def trials(self) -> int:
        return self.config.budget.tuning_trials

    def tuner(self, cell: GridCell) -> Tuner:
        target = cell.target(self.config.budget.tuning_seeds)
        key = (target.method, target.task, target.student, target.task_epochs)
        if key not in self._tuners:
            self._tuners[key] = Tuner(self.suite, target, self.results, self.storage_url,
                                      self.cache_dir, pruner=self.config.budget.pruner,
                                      log=self.log, tracking=self.tracking)
        return self._tuners[key]

    def _student(self, cell: GridCell) -> str:
        """The student shape the cell trains."""
        return cell.student or self.suite.student_for(cell.method)[0]

    def tuned_file(self, cell: GridCell) -> TunedParams | None:
        """The ``--params`` file for the cell: of its method and task, tuned on its student
        (a file that names no student applies to every student of the method that no
        other file names)."""
        params = self.tuned.get((cell.method, cell.task, self._student(cell)))
        return params if params is not None else self.tuned.get((cell.method, cell.task, None))

    def tuned_overrides(self, cell: GridCell) -> dict[str, Any] | None:
        """The cell's tuned parameters: a ``--params`` file's, else the best of its study
        (None: not tuned yet), else none."""
        if (params := self.tuned_file(cell)) is not None:
            return params.overrides
        if not self.trials:
            return {}
        path = tuned_path(self.results, self.tuner(cell).name)
        return load_tuned(str(path), self.results).overrides if path.exists() else None

    def variation(self, cell: GridCell, overrides: dict[str, Any]) -> Variation:
        return Variation.of(cell.student, overrides, cell.task_epochs)

    # -- planning -------------------------------------------------------------------------
    def plan(self) -> list[PlannedCell]:
        costs = CostModel.from_store(self.results)
        planned = []
        for cell in self.cells:
            overrides = self.tuned_overrides(cell)
            plan = self.runner.planner.resolve(cell.method, cell.task, cell.seed,
                                               self.variation(cell, overrides or {}))
            train_rows = len(self.runner.planner.prepare_task(cell.task).splits["train"])
            task_epochs = sum(plan.stage_configs[stage.name].epochs
                              for stage in plan.task_stages)
            examples = int(task_epochs * train_rows)
            estimate = costs.estimate(cell.method, self.suite.plugin(cell.method), cell.task,
                                      plan.shape_name, examples, budget_rules(
                                          [plan.stage_configs[stage.name].identity()
                                           for stage in plan.task_stages]))
            # the ids the same configuration has where ``auto`` resolves otherwise
            others = self.runner.planner.equivalent_run_ids(plan)
            status, run_id = ("tune", None) if overrides is None \
                else self._recorded_status(plan, others)
            self._estimates[cell] = estimate
            self._run_ids[cell] = self._queue_id(cell, plan, others, bool(overrides))
            if status in {"done", "failed"}:
                self._recorded.add(cell)
            planned.append(PlannedCell(cell, run_id, status, task_epochs, examples, estimate))
        return planned

    def _recorded_status(self, plan: CellPlan, others: list[str]) -> tuple[str, str]:
        """A planned cell's status (``todo``, ``done``, ``failed``) and run id: the id of
        its record where the store has one (that of the other precision, maybe)."""
        run_id = plan.run_id
        existing = self.runner.recorded(plan, equivalents=others)
        status = "todo"
        if existing is not None:
            record = self.runner.store.load(existing)
            if code_change(record.code, self.runner.planner.run_code(plan.method_name)):
                existing = None  # stale: made by other code, so trained again
            else:
                run_id, status = record.run_id, record.status
        return {"finished": "done"}.get(status, status), run_id

    def _queue_id(self, cell: GridCell, plan: CellPlan, others: list[str], tuned: bool
                  ) -> str:
        """The id that names a cell in the queue.  The queue is named by the cells'
        untuned configurations, so that a worker started before the tuning (which plans
        at once) and one started after it name the same queue; each cell reads its tuned
        parameters when it runs.  And by the smallest of the ids its ``auto`` precisions
        give, so that workers on CPUs with and without native bf16 share one queue rather
        than each planning (and running) the whole grid; each cell trains in its worker's
        precision."""
        ids = [plan.run_id, *others]
        if tuned:
            try:
                untuned = self.runner.planner.resolve(cell.method, cell.task, cell.seed,
                                                      self.variation(cell, {}))
                ids = [untuned.run_id, *self.runner.planner.equivalent_run_ids(untuned)]
            except ConfigError:
                # The recipe alone does not fit; its --params file's values make the
                # cell fit (every worker has them from the start, as the runner's check
                # has): the queue is named by the configuration the cell runs.  Only a
                # configuration error, the same on every machine: a missing asset
                # differs between workers, which must all name one queue.
                pass
        return min(ids)

    def cell_records(self, planned: list[PlannedCell] | None = None
                     ) -> list[tuple[GridCell, RunRecord]]:
        """The finished cells with their run records (whichever command made the run)."""
        found = []
        for item in planned or self.plan():
            if item.status != "done" or item.run_id is None:
                continue
            path = self.runner.store.find(item.run_id)
            if path is not None:
                found.append((item.cell, self.runner.store.load(path)))
        return found

    def missing(self, planned: list[PlannedCell]) -> str | None:
        """Which cells have no finished run, by method (None when every cell has one): a
        leaderboard of the grid says so rather than drop a row or a task without a word."""
        open_cells = [item for item in planned if item.status != "done"]
        if not open_cells:
            return None
        by_method: dict[str, list[PlannedCell]] = defaultdict(list)
        for item in open_cells:
            by_method[item.cell.row].append(item)
        parts = []
        for label, items in by_method.items():
            tasks = list(dict.fromkeys(item.cell.task for item in items))
            seeds = sorted({item.cell.seed for item in items})
            statuses = sorted({item.status for item in items})
            parts.append(f"{label} x{len(items)} ({', '.join(tasks)}; seeds "
                         f"{', '.join(map(str, seeds))}; {'/'.join(statuses)})")
        return (f"{len(open_cells)} of {len(planned)} grid cells have no finished run: "
                + "; ".join(parts))

    def records(self, planned: list[PlannedCell] | None = None) -> list[dict[str, Any]]:
        """The finished cells' scores, one row per cell (the grid's leaderboard: each method
        on the grid's budget, whichever command made the run)."""
        return [{"method": cell.row,
                 "task": cell.task, "seed": cell.seed, "score": record.main_score,
                 "seconds": record.wall_seconds}
                for cell, record in self.cell_records(planned)]

    def describe(self, planned: list[PlannedCell]) -> list[str]:
        """The dry-run table and totals."""
        budget = self.config.budget
        lines = [f"grid of suite {self.suite.name}: {len(planned)} cells; budget: task "
                 f"epochs {budget.task_epochs if budget.task_epochs is not None else 'per recipe'}"
                 f"{f' ({budget.task_epochs_for})' if budget.task_epochs_for else ''}"
                 f"{f', own recipe budget for {budget.own_budget}' if budget.own_budget else ''}, "
                 f"tuning trials {budget.tuning_trials} per method and task"
                 f"{f' (seeds {budget.tuning_seeds})' if budget.tuning_trials else ''}",
                 "",
                 f"{'method':<20} {'student':<10} {'task':<5} {'seed':>4} {'epochs':>6} "
                 f"{'examples':>9} {'est.':>7}  {'status':<6} run id"]
        for item in planned:
            cell = item.cell
            student = self._student(cell)
            estimate = _duration(item.estimate) if item.estimate is not None else "?"
            lines.append(f"{cell.method:<20} {student:<10} {cell.task:<5} {cell.seed:>4} "
                         f"{item.task_epochs:>6.3g} {item.examples:>9,} {estimate:>7}  "
                         f"{item.status:<6} {(item.run_id or '-')[:16]}")
        todo = [item for item in planned if item.status in {"todo", "tune"}]
        known = [item.estimate for item in todo if item.estimate is not None]
        lines.append("")
        counts = {status: sum(item.status == status for item in planned)
                  for status in ("done", "failed", "todo", "tune")}
        lines.append(", ".join(f"{count} {status}" for status, count in counts.items()
                               if count))
        unknown = len(todo) - len(known)
        no_record = ("no earlier record of their task and student trained by the same "
                     "budget rules")
        if not todo:
            lines.append("estimated cost of the cells to run: none, nothing to run")
        elif not known:
            lines.append(f"estimated cost of the cells to run: cannot be estimated: the "
                         f"results store ({self.results}) has {no_record}")
        else:
            lines.append(f"estimated cost of the cells to run: {_duration(sum(known))} of "
                         f"one worker" + (f" for {len(known)} of the {len(todo)} cells "
                                          f"({unknown} without an estimate: {no_record})"
                                          if unknown else ""))
        if self.trials:
            studies = {self.tuner(item.cell).name for item in planned}
            lines.append(f"tuning first: {len(studies)} studies x {self.trials} trials x "
                         f"{len(budget.tuning_seeds)} seeds (pruned trials stop early)")
        return lines

    # -- working ----------------------------------------------------------------------------
    @property
    def study_name(self) -> str:
        """The queue's name: a hash of the cells and of their run ids, so a change of
        configuration or data (new run ids) makes a new queue rather than one whose cells
        were completed by runs of another configuration."""
        if len(self._run_ids) < len(self.cells):
            self.plan()
        keys = [{**asdict(cell), "run_id": self._run_ids[cell]} for cell in self.cells]
        digest = content_hash({"cells": keys, "budget": self.config.budget.model_dump(),
                               **({"tuned": self._tuned_by_name()} if self.tuned else {})})
        return f"grid-{self.suite.record_suite}-{digest[:10]}"

    def _tuned_by_name(self) -> dict[str, dict[str, Any]]:
        """The --params files' values by method and task (and student, where a method and
        task have one file per student), as the queue's name hashes them."""
        files = defaultdict(list)
        for (method, task, _), params in self.tuned.items():
            files[method, task].append(params)
        return {f"{method}/{task}" + (f"/{params.student}" if len(files[method, task]) > 1
                                      else ""): params.overrides
                for (method, task, _), params in self.tuned.items()}

    def _grid_study(self):
        """The grid's queue, created by the first worker and joined by the rest. Every
        worker queues the cells that have no trial yet (:meth:`unsettled`), the first one
        all of them: a worker killed while filling it leaves nothing to wait for, and a
        cell queued by two workers at once runs once (:func:`_duplicate`)."""
        import optuna

        storage = open_storage(self.storage_url)
        return optuna.create_study(study_name=self.study_name, storage=storage,
                                   direction="maximize", load_if_exists=True)

    def unsettled(self, study, planned: list[PlannedCell] | None = None
                  ) -> list[tuple[GridCell, int | None]]:
        """The cells to queue again, each with the number of its last trial (None: it has
        none): those without a waiting or running trial whose record does not settle them.
        A finished record settles a cell once a trial of it completed (else its trial
        finds the record and completes); a failed record (a diverged run) is the cell's
        result unless the runner retries failed runs; without a record the cell runs,
        unless its last trial is a dead worker's that the heartbeat check gave up
        retrying (its worker died ``MAX_RETRIES + 1`` times in a row: an out-of-memory
        kill, say, which would kill every worker that starts)."""
        statuses = {item.cell: item.status
                    for item in (planned if planned is not None else self.plan())}
        trials: dict[GridCell, list] = {}
        for trial in study.get_trials(deepcopy=False):
            if "cell" in trial.user_attrs and not trial.user_attrs.get("duplicate"):
                trials.setdefault(GridCell(**trial.user_attrs["cell"]), []).append(trial)
        unsettled = []
        for cell in self.cells:
            own = trials.get(cell, [])
            if not own:  # not queued yet: its trial finds a record, or runs it
                unsettled.append((cell, None))
                continue
            states = {trial.state.name for trial in own}
            if states & {"WAITING", "RUNNING"}:
                continue
            status = statuses[cell]  # done or failed: recorded; todo or tune: not
            if status == "done" and "COMPLETE" in states:
                continue
            if status == "failed" and not self.runner.retry_failed:
                continue
            last = max(own, key=lambda trial: trial.number)
            if status in {"todo", "tune"} and _given_up(last):
                self.log(f"[grid] {cell.label}: not queued again: its worker died "
                         f"{len(last.system_attrs.get('retry_history', [])) + 1} times "
                         f"in a row (trial {last.number})")
                continue
            unsettled.append((cell, last.number))
        return unsettled

    def enqueue_again(self, study, cells: list[tuple[GridCell, int | None]]) -> None:
        """Queue ``cells``, each as a retry of its last trial (as the heartbeat check
        retries a dead worker's), or for the first time (None): a cell queued twice by
        workers starting together, or by one of them and the check, runs once, see
        :func:`_duplicate`."""
        import optuna

        for cell, last in cells:
            retry = {} if last is None else {"failed_trial": last, "retry_history": [last]}
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.WAITING, user_attrs={"cell": asdict(cell)},
                system_attrs=retry))

    def work(self) -> dict[str, int]:
        """Tune (if the budget says so), then run cells until the queue is empty."""
        accelerator = self.runner.accelerator
        if self.trials:
            studies = {id(tuner): tuner for tuner in (
                self.tuner(cell) for cell in self.cells if self.tuned_file(cell) is None)}
            for tuner in studies.values():  # one study per method, task, student, budget
                tuner.optimize(self.trials, self.poll_seconds, self.reclaim_local)
                if accelerator.is_main_process:  # (re)written: a study may have grown
                    tuner.write_best()
        if not accelerator.is_main_process:
            self._follow()
            return {}
        try:
            return self._work_queue()
        finally:
            broadcast(("stop",), accelerator)

    def _follow(self) -> None:
        """Processes other than 0 of an `accelerate launch`: run the cells process 0 pops."""
        while True:
            message = broadcast(None, self.runner.accelerator)
            if message[0] == "stop":
                return
            cell, overrides = GridCell(**message[1]), message[2]
            try:
                self.runner.run_one(cell.method, cell.task, cell.seed,
                                    self.variation(cell, overrides))
            except TeacherError:
                continue  # process 0 fails the cell in one line and sends the next
            except (StoreNotWritableError, InvalidRecordError):
                # Process 0 stops on the same error (a store it cannot write, a record
                # that does not load) and tells the others so: take that message before
                # leaving, or process 0 would report a vanished peer.
                broadcast(None, self.runner.accelerator)
                raise

    def _work_queue(self) -> dict[str, int]:
        from optuna.storages import fail_stale_trials

        study = self._grid_study()
        self.log(f"[grid] study {self.study_name} on {mask_url(self.storage_url)}: "
                 f"{len(self.cells)} cells")
        fail_stale_trials(study)  # dead workers' cells are retried, not queued again here
        if self.reclaim_local:
            fail_dead_local_trials(study)
        unsettled = self.unsettled(study)  # plans every cell: its statuses and estimates
        self.enqueue_again(study, unsettled)
        new = sum(1 for _, last in unsettled if last is None)
        if 0 < new < len(self.cells):  # the rest were queued by a worker that died, or is
            self.log(f"[grid] queued {new} cells no worker had queued yet")  # still queuing
        labels = [cell.label for cell, last in unsettled if last is not None]
        if labels:
            self.log(f"[grid] queued again {len(labels)} cells stopped without a record: "
                     + "; ".join(labels[:5]) + (" ..." if len(labels) > 5 else ""))
        started = time.perf_counter()
        ran: list[tuple[GridCell, float]] = []
        while True:
            fail_stale_trials(study)
            if self.reclaim_local:
                fail_dead_local_trials(study)
            counts = _counts(study)
            if counts["waiting"]:
                before = time.perf_counter()
                trial_cell: list[GridCell] = []
                # Every way a cell stops is reported by the harness (see _objective), so
                # Optuna logs none of them; only a cell's own failure lets the grid go on.
                with quiet_reported_failures():
                    study.optimize(functools.partial(self._objective, ran=trial_cell),
                                   n_trials=1, catch=(TrialFailed,))
                if trial_cell:
                    ran.append((trial_cell[0], time.perf_counter() - before))
                    self._progress(study, ran, started)
            elif counts["running"]:
                time.sleep(self.poll_seconds or 5.0)  # others' cells, or a dead worker's
            else:
                break
        return self.summary(study)

    def _objective(self, trial, ran: list[GridCell]) -> float:
        import optuna

        cell_fields = trial.user_attrs.get("cell")
        if cell_fields is None:  # another worker emptied the queue between check and pop
            trial.set_user_attr("empty", True)
            raise optuna.TrialPruned("no cell left")
        if _duplicate(trial.study, trial.number):
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned("its cell was queued again twice; the other copy runs")
        cell = GridCell(**cell_fields)
        trial.set_user_attr("worker", worker_id())
        overrides = self.tuned_overrides(cell)
        if overrides is None:
            raise self._failed(trial.number, cell, "its tuning study has not written "
                               "parameters; the cell is not run")
        broadcast(("cell", asdict(cell), overrides), self.runner.accelerator)
        self.log(f"== grid cell {trial.number}: {cell.label}")
        annotations = {"grid": {"study": self.study_name, "trial": trial.number}}
        if (params := self.tuned_file(cell)) is not None:
            annotations["tuned"] = params.annotation()
        elif overrides:
            annotations["tuned"] = {"study": self.tuner(cell).name}
        try:
            outcome: RunOutcome = self.runner.run_one(
                cell.method, cell.task, cell.seed, self.variation(cell, overrides),
                annotations=annotations)
        except BaseException as error:  # Ctrl-C or a crash, not a dead worker (_given_up)
            # Not recorded: the next worker to start queues the cell again.
            trial.set_user_attr("stopped", f"{type(error).__name__}: {error}"[:1000])
            if isinstance(error, KeyboardInterrupt):
                raise GridInterrupted(self.study_name, trial.number, cell.label) from None
            if isinstance(error, TeacherError):  # the task's teacher: its other cells too
                raise self._failed(trial.number, cell, f"teacher: {error}") from None
            if isinstance(error, STOPPING_ERRORS):
                raise
            raise GridCellError(self.study_name, trial.number, cell.label) from error
        trial.set_user_attr("status", outcome.status)
        trial.set_user_attr("record", str(outcome.path))
        ran.append(cell)
        if outcome.main_score is None:  # a failed run (diverged): its record says why
            raise self._failed(trial.number, cell, failed_run(outcome))
        return float(outcome.main_score)

    def _failed(self, number: int, cell: GridCell, why: str) -> TrialFailed:
        """The error that fails trial ``number`` of ``cell``, logged here in one line (Optuna
        logs no traceback of it: see quiet_reported_failures)."""
        self.log(f"[grid] cell {number} failed: {cell.label}: {why}")
        return TrialFailed(f"{cell.label}: {why}")

    def _progress(self, study, ran: list[tuple[GridCell, float]], started: float) -> None:
        """Overall progress and an estimate of the time left: the remaining cells' cost
        estimates scaled by how this worker's trained cells compared with theirs (cells
        without an estimate count as this worker's mean trained cell), shared among the
        workers running now."""
        counts = _counts(study)
        done = counts["complete"] + counts["fail"] - _retried(study)
        trained = [(cell, seconds) for cell, seconds in ran if seconds > 1.0]
        estimated = [(self._estimates[cell], seconds) for cell, seconds in trained
                     if self._estimates.get(cell)]
        ratio = (sum(seconds for _, seconds in estimated)
                 / sum(estimate for estimate, _ in estimated)) if estimated else 1.0
        mean = (sum(seconds for _, seconds in trained) / len(trained)) if trained else None
        pending = {GridCell(**trial.user_attrs["cell"]) for trial in
                   study.get_trials(deepcopy=False)
                   if trial.state.name in {"WAITING", "RUNNING"} and "cell" in trial.user_attrs}
        left = 0.0
        for cell in pending:
            estimate = self._estimates.get(cell)
            if cell in self._recorded:  # will be found, not trained
                continue
            if estimate is not None:
                left += estimate * ratio
            elif mean is not None:
                left += mean
        workers = 1 + len({trial.user_attrs.get("worker") for trial in
                           study.get_trials(deepcopy=False) if trial.state.name == "RUNNING"})
        self.log(f"[grid] {done}/{len(self.cells)} cells done ({counts['running']} running "
                 f"elsewhere); this worker: {len(ran)} in "
                 f"{_duration(time.perf_counter() - started)}; about "
                 f"{_duration(left / workers)} left")

    def summary(self, study) -> dict[str, int]:
        """Trial counts; ``complete`` counts cells (a cell whose record went missing
        completes a second trial when it runs again)."""
        complete = {GridCell(**trial.user_attrs["cell"])
                    for trial in study.get_trials(deepcopy=False)
                    if trial.state.name == "COMPLETE" and "cell" in trial.user_attrs}
        return {**_counts(study), "complete": len(complete), "cells": len(self.cells),
                "retried": _retried(study)}


class GridCellError(UnexpectedError):
    """An unexpected error (a bug, its ``__cause__``) stopped ``trial`` of study ``study``,
    which ran ``cell`` (a label): the grid stops rather than meet it in every later cell,
    and the cell, which has no record, is queued again by the next worker to start.  A
    cell's own failure (a diverged run, its task's teacher) is not one: it fails the cell,
    in one line, and the grid goes on."""

    def __init__(self, study: str, trial: int, cell: str) -> None:
        super().__init__(study, trial, cell)
        self.study = study
        self.trial = trial
        self.cell = cell

    def __str__(self) -> str:
        cause = self.__cause__
        return (f"cell {self.cell} (trial {self.trial}) stopped the grid {self.study} with "
                f"{type(cause).__name__}: {cause}\nthe cell is not recorded: once the error "
                "is fixed the same command queues it again and resumes the grid")


class GridInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a grid cell: ``trial`` of study ``study`` ran ``cell`` (a label), which
    has no record; the next worker queues it again."""

    def __init__(self, study: str, trial: int, cell: str) -> None:
        super().__init__(study, trial, cell)
        self.study = study
        self.trial = trial
        self.cell = cell


def _counts(study) -> dict[str, int]:
    """Trials by state, less the empty pops and the duplicates of queued-again cells."""
    from optuna.trial import TrialState

    counts = {state.name.lower(): 0 for state in TrialState}
    for trial in study.get_trials(deepcopy=False):
        if not (trial.user_attrs.get("empty") or trial.user_attrs.get("duplicate")):
            counts[trial.state.name.lower()] += 1
    return counts


def _retried(study) -> int:
    """Failed trials that a retry replaced (their cell is queued or ran again)."""
    trials = study.get_trials(deepcopy=False)
    replaced = retried_trials(trials)
    return sum(1 for trial in trials if trial.state.name == "FAIL"
               and "cell" in trial.user_attrs and trial.number in replaced)


def _given_up(trial) -> bool:
    """Whether ``trial`` is a dead worker's (failed by the heartbeat check, not stopped
    in its own process) that the check did not retry: the last of ``MAX_RETRIES``
    retries (the check's callback retries while the history is at most that long)."""
    return (trial.state.name == "FAIL" and "stopped" not in trial.user_attrs
            and "status" not in trial.user_attrs
            and len(trial.system_attrs.get("retry_history", [])) + 1 > MAX_RETRIES)


def _duplicate(study, number: int) -> bool:
    """Whether trial ``number`` is a second copy of one queueing of its cell: a cell may be
    queued for the first time by two workers filling a new queue at once, and a cell's
    failed trial may be queued again by the heartbeat check and by a starting worker, or
    by two starting workers at once (neither sees the other's copy yet).  Copies stand for
    the same trial (the one they retry, or none); the first copy runs and the later ones
    step aside, whichever worker pops them and whenever: the first exists (waiting,
    running or finished) before a later one does."""
    trials = study.get_trials(deepcopy=False)
    trial = next(trial for trial in trials if trial.number == number)

    def retried(other) -> int | None:  # the trial it retries; None: a first queueing
        return (other.system_attrs.get("retry_history") or [None])[-1]

    return any(other.number < number
               and other.user_attrs.get("cell") == trial.user_attrs.get("cell")
               and retried(other) == retried(trial)
               for other in trials)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
