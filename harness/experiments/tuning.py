"""Optuna tuning of one method on one task, on a shared relational storage.

A study is named from what it tunes (suite, method, task, seeds and the resolved recipe
the search starts from), so re-running the same command resumes it, and several workers
(processes, machines) pointed at one storage add trials to one study.  The search space is
the plugin's :meth:`Method.search_space`; the objective is the dev main metric of the
best checkpoint, averaged over the seeds; every dev evaluation is reported, so a median
or successive-halving pruner stops hopeless trials early.  Trial runs are recorded in
their own store (``<results>/tuning/<study>/``), apart from the suite's leaderboard.

Workers record a heartbeat: a trial whose worker died is marked failed after the grace
period and re-queued with the same parameters (``RetryHeartbeatStaleTrialCallback``), and
the next worker to ask for a trial takes it; a trial stopped by Ctrl-C is re-queued
alike.  Each trial's random draws are seeded from the study's name and the trial's number
(:func:`make_sampler`), so parallel workers do not propose one another's parameters.  A
study whose trials keep failing stops once as many have failed as it was asked to finish.
Under ``accelerate launch`` process 0 talks to the storage and broadcasts every trial's
parameters and pruning decisions to the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from harness.api.method import Method
from harness.api.registry import code_location, instantiate
from harness.common.cache import content_hash
from harness.common.files import write_text_atomic
from harness.common.paths import PathEscapeError, contained
from harness.config.schema import OVERRIDE_ROOTS, ConfigError, SuiteConfig, TrainOverride
from harness.data.tasks import get_task
from harness.experiments.storage import HEARTBEAT_SECONDS, mask_url, open_storage
from harness.experiments.store import NESTED_STORES, InvalidRecordError, StoreNotWritableError
from harness.experiments.tracking import Tracking
from harness.training.distributed import broadcast, gather

if TYPE_CHECKING:  # the runner is imported where a tuner first needs it
    from harness.experiments.runner import RunOutcome

TUNED_DIR = "tuned"
TUNING_DIR = NESTED_STORES[0]


class TuningInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a study's trial; ``trial``: the number of the trial stopped, whose
    parameters are queued again (None: none was running, or the retries are used up)."""

    def __init__(self, study: str, trial: int | None) -> None:
        super().__init__(study, trial)
        self.study = study
        self.trial = trial


class TrialFailed(RuntimeError):
    """A trial or grid cell that failed in a way the harness reports itself, in one line
    naming the cell and why (a run recorded as failed, a cell it will not run): Optuna
    records its trial as FAIL without logging a traceback of it."""


STOPPING_ERRORS: tuple[type[Exception], ...] = (
    ConfigError, StoreNotWritableError, InvalidRecordError, FileNotFoundError)
"""Errors of a trial or grid cell that stop the command as they are: their message, which
names the setting, record, store or missing file, is what the command prints (in one
line)."""


class UnexpectedError(Exception):
    """An unexpected error (a bug, its ``__cause__``) stopped a trial or a grid cell: the
    command prints its traceback, once, then this error's message (what it stopped, and
    that the same command resumes), and exits 1, rather than meet the bug again in every
    later trial or cell."""


class TrialCrashed(UnexpectedError):
    """An unexpected error stopped ``trial`` of study ``study``; ``queued``: whether its
    parameters were queued again (as a Ctrl-C's are: the study runs them once the bug is
    fixed)."""

    def __init__(self, study: str, trial: int) -> None:
        super().__init__(study, trial)
        self.study = study
        self.trial = trial
        self.queued = False

    def __str__(self) -> str:
        cause = self.__cause__
        queued = "its parameters are queued again; " if self.queued else ""
        return (f"trial {self.trial} of study {self.study} stopped with "
                f"{type(cause).__name__}: {cause}\n{queued}once the error is fixed the same "
                "command resumes the study")


def failed_run(outcome: RunOutcome) -> str:
    """Why a run (a :class:`~harness.experiments.runner.RunOutcome`) gave no score, for the
    line of the trial or grid cell it failed: its record's status and error (a failed
    record found in the store is the runner's "skipped", and its record's "failed"), and
    where that record is."""
    record = outcome.record
    status = record.status if record is not None else outcome.status
    error = record.error if record is not None else None
    return f"run {status}{f': {error}' if error else ''}; recorded at {outcome.path}"


REPORTED_FAILURES: tuple[type[BaseException], ...] = (
    KeyboardInterrupt, TrialFailed, UnexpectedError, *STOPPING_ERRORS)
"""Errors of a trial or grid cell that the harness reports itself: the command says what
Ctrl-C left, prints a failed cell's line, a bug's traceback (once) and a stopping error's
message: Optuna's warning about such a trial, and its traceback, would repeat them.  Any
other error keeps Optuna's warning and traceback (a tuning trial's unexpected
RuntimeError, which fails the trial and lets the study go on)."""


class _QuietReportedFailures(logging.Filter):
    """Drops Optuna's two warnings about a trial that failed with one of
    :data:`REPORTED_FAILURES`: "Trial N failed with parameters ... because of the following
    error" (with the traceback), then "Trial N failed with value None"."""

    def __init__(self) -> None:
        super().__init__()
        self._dropped: set[str] = set()  # "Trial N" of each trial whose warning was dropped

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        error = record.exc_info[0] if record.exc_info else None
        if error is not None and issubclass(error, REPORTED_FAILURES):
            self._dropped.add(message.partition(" failed ")[0])
            return False
        trial, found, _ = message.partition(" failed with value ")
        return not (found and trial in self._dropped)


@contextlib.contextmanager
def quiet_reported_failures() -> Iterator[None]:
    """While the trials it wraps run, Optuna logs no warning about a trial that failed with
    one of :data:`REPORTED_FAILURES`; their states are Optuna's own (FAIL)."""
    logger = logging.getLogger("optuna.study._optimize")
    quiet = _QuietReportedFailures()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class TuningTarget:
    """What one study tunes: a method on a task, averaged over seeds, with a grid cell's
    student shape and budget when it serves a grid."""

    method: str
    task: str
    seeds: list[int]
    student: str | None = None
    task_epochs: float | None = None

    def variation(self, overrides: dict[str, Any] | None = None):
        from harness.experiments.planner import Variation

        return Variation.of(self.student, overrides, self.task_epochs)


def study_name(runner, target: TuningTarget) -> str:
    """Deterministic: the same suite recipe, method, task, seeds, student and budget always
    name the same study; change any of them and a new study starts."""
    plan = runner.planner.resolve(target.method, target.task, target.seeds[0],
                                  target.variation())
    spec = {key: value for key, value in plan.spec.items() if key != "seed"}
    digest = content_hash({"spec": spec, "seeds": target.seeds})[:10]
    return f"tune-{runner.suite.record_suite}-{target.method}-{target.task}-{digest}"


def trial_seed(study: str, number: int) -> int:
    """The sampler's seed for trial ``number`` of ``study``."""
    return int(content_hash({"study": study, "trial": number})[:8], 16)


def make_sampler(study: str, n_startup_trials: int = 5):
    """TPE whose random draws in each trial are seeded from the study's name and the
    trial's number (:func:`trial_seed`).  The storage numbers trials once, whichever worker
    asks, so parallel workers draw differently (with one seed per study, every worker
    drew the same parameters as the others), while a study one worker runs alone repeats.
    Between trials a fresh TPE sampler replaces the last one: a TPE sampler keeps no state
    across trials but its random generator."""
    import optuna

    def tpe(number: int) -> optuna.samplers.TPESampler:
        return optuna.samplers.TPESampler(seed=trial_seed(study, number),
                                          n_startup_trials=n_startup_trials)

    class TrialSeededSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self.sampler = tpe(0)

        def before_trial(self, study, trial) -> None:
            self.sampler = tpe(trial.number)
            self.sampler.before_trial(study, trial)

        def infer_relative_search_space(self, study, trial):
            return self.sampler.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self.sampler.sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self.sampler.sample_independent(study, trial, param_name,
                                                   param_distribution)

        def after_trial(self, study, trial, state, values) -> None:
            self.sampler.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self.sampler.reseed_rng()

    return TrialSeededSampler()


def retried_trials(trials) -> set[int]:
    """The numbers of the failed trials that a retry replaced (queued again)."""
    return {number for trial in trials
            for number in trial.system_attrs.get("retry_history", [])}


def make_pruner(kind: str):
    import optuna

    if kind == "median":
        # Three finished trials before any pruning; the first evaluation may prune.
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


@dataclass
class Tuner:
    """Runs trials of one study; shared by `harness tune`, the grid and its workers."""

    suite: SuiteConfig
    target: TuningTarget
    results: Path
    storage_url: str = field(repr=False)  # may hold a password: shown through mask_url
    cache_dir: Path | None = None
    pruner: str = "median"
    log: Callable[[str], None] = print
    tracking: Tracking | None = None
    """Experiment trackers for the trial runs (tracker runs under ``tuning/<study>/``)."""
    _runner: Any = field(default=None, init=False)
    _name: str | None = field(default=None, init=False)
    _space_checked: bool = field(default=False, init=False)
    _running: int | None = field(default=None, init=False)
    """The storage id of the trial this process's objective is running."""
    _interrupted: bool = field(default=False, init=False)
    """Whether Ctrl-C stopped this process's running trial."""

    @property
    def runner(self):
        """A runner whose records go to the study's own store (not the leaderboard)."""
        if self._runner is None:
            from harness.experiments.runner import SuiteRunner

            runner = SuiteRunner(self.suite, self.results, self.cache_dir, log=self.log,
                                 tracking=self.tracking)
            self._name = study_name(runner, self.target)
            runner.store.root = contained(self.results, TUNING_DIR, self._name)
            self._runner = runner
        return self._runner

    @property
    def name(self) -> str:
        """The study's name (see :func:`study_name`)."""
        self.runner  # noqa: B018  (names the study)
        assert self._name is not None
        return self._name

    def study(self):
        """The study, created on first use with the recipe's own point queued as its
        first trial (see :meth:`recipe_point`), once its search space has been checked
        (:meth:`check_search_space`): a study is never created for a space no trial can
        run."""
        import optuna

        self.check_search_space()
        study = optuna.create_study(
            study_name=self.name, storage=open_storage(self.storage_url),
            direction="maximize", load_if_exists=True, sampler=make_sampler(self.name),
            pruner=make_pruner(self.pruner))
        if not study.trials and "recipe_point" not in study.user_attrs:
            point = self.recipe_point()
            study.set_user_attr("recipe_point", point)
            if point:
                study.enqueue_trial(point, user_attrs={"recipe": True}, skip_if_exists=True)
        return study

    def recipe_point(self) -> dict[str, Any]:
        """The recipe's own values of the searched parameters ({} when one lies outside
        the space).  Tried first, so the best trial is never worse than the untuned recipe
        on the tuning seeds, and the study shows what tuning gained over it."""
        self.check_search_space()
        recorder = _RecordingTrial()
        keys = list(self._search_space(recorder))
        if len(keys) != len(recorder.calls):  # not one suggestion per override: unmatched
            return {}
        plan = self.runner.planner.resolve(self.target.method, self.target.task,
                                           self.target.seeds[0], self.target.variation())
        spec, configs = plan.spec, plan.stage_configs
        point = {}
        for key, (name, distribution) in zip(keys, recorder.calls, strict=True):
            root, *rest = key.split(".")
            if root == "stages":
                if rest[0] not in configs:  # a stage the method runs on other tasks only
                    return {}
                value: Any = getattr(configs[rest[0]], rest[1])
            else:
                value = spec["params" if root == "params" else "loss_weights"]
                for part in rest:
                    value = value[part]
            try:
                if not distribution._contains(distribution.to_internal_repr(value)):
                    return {}
            except (ValueError, TypeError):
                return {}
            point[name] = value
        return point

    def check_search_space(self) -> None:
        """Every key of the plugin's search space must be an override the target's recipe
        takes; a ConfigError (one line: the file that declares the space, the key, and
        what is valid there) otherwise.  Checked before a study exists, since the recipe
        point and every trial read these keys."""
        if self._space_checked:
            return
        method = self._method()
        overrides = self._search_space(_RecordingTrial(), method)
        where = f"{search_space_source(method)}: search space of {self.target.method}"
        for key, value in overrides.items():
            problem = override_problem(method, self.target.task, key)
            if problem is None:  # the key's form is right: its value must resolve too
                try:
                    self.runner.planner.resolve(
                        self.target.method, self.target.task, self.target.seeds[0],
                        self.target.variation({key: value}))
                except ConfigError as error:
                    problem = "; ".join(line.strip() for line in str(error).splitlines())
            if problem is not None:
                raise ConfigError(f"{where}: {key!r}: {problem}")
        self._space_checked = True

    # -- the objective -------------------------------------------------------------------
    def _method(self) -> Method:
        recipe = self.suite.recipe(self.target.method)
        return instantiate(self.suite.plugin(self.target.method), recipe, self.target.task)

    def _search_space(self, trial, method: Method | None = None) -> dict[str, Any]:
        overrides = (method or self._method()).search_space(trial)
        if not overrides:
            raise ConfigError(f"{self.target.method}: its plugin declares no search space")
        return overrides

    def evaluate(self, overrides: dict[str, Any], trial=None) -> list[float]:
        """Train the target with ``overrides`` on every seed; the seeds' main scores.
        With ``trial`` (process 0 of a launch, or a single process), every dev evaluation
        is reported to it and a pruning decision stops all processes alike."""
        import optuna

        accelerator = self.runner.accelerator
        agreed = gather((self.name, content_hash(overrides)), accelerator)
        if len(set(agreed)) != 1:
            raise RuntimeError(f"processes disagree on the study or the trial's parameters: "
                               f"{agreed}")
        reported = 0
        scores = []

        def on_evaluate(_: int, evaluation: dict[str, Any]) -> None:
            nonlocal reported
            prune = False
            if trial is not None:
                trial.report(float(evaluation["main"]), reported)
                prune = trial.should_prune()
            reported += 1
            if broadcast(prune, accelerator):
                raise optuna.TrialPruned(f"pruned at evaluation {reported} "
                                         f"({evaluation['main']:.2f})")

        annotations = {"tuning": {"study": self.name,
                                  "trial": trial.number if trial is not None else None}}
        for seed in self.target.seeds:
            try:
                outcome = self.runner.run_one(self.target.method, self.target.task, seed,
                                              self.target.variation(overrides),
                                              on_evaluate=on_evaluate, annotations=annotations)
            except optuna.TrialPruned:
                accelerator.free_memory()  # the stopped stage's prepared model and optimiser
                raise
            if outcome.main_score is None:
                raise TrialFailed(f"seed {seed}: {failed_run(outcome)}")
            if outcome.status == "skipped" and outcome.record is not None:
                # A seed found in the store reports the evaluations it recorded, so the
                # next seed's evaluations keep the numbers the pruner compares them under.
                record = outcome.record
                for stage in record.stages:
                    for evaluation in stage.evaluations:
                        on_evaluate(0, {"stage": stage.name, "step": evaluation["step"],
                                        "main": float(evaluation[record.main_metric])})
            scores.append(float(outcome.main_score))
        return scores

    def objective(self, trial) -> float:
        import optuna

        accelerator = self.runner.accelerator
        self._running = trial._trial_id
        trial.set_user_attr("worker", worker_id())
        overrides = self._search_space(trial)
        broadcast(("trial", overrides), accelerator)
        started = time.perf_counter()
        try:
            scores = self.evaluate(overrides, trial)
        except optuna.TrialPruned as pruned:
            self.log(f"[tune] trial {trial.number}: {pruned} after "
                     f"{time.perf_counter() - started:.0f}s with {overrides}")
            raise
        except RuntimeError as error:  # a failed run: counts towards the cap (see optimize)
            trial.set_user_attr("error", str(error))
            if isinstance(error, TrialFailed):  # Optuna logs any other error's traceback
                self.log(f"[tune] trial {trial.number}: failed after "
                         f"{time.perf_counter() - started:.0f}s with {overrides}: {error}")
            raise
        except STOPPING_ERRORS:
            raise
        except Exception as error:  # a bug: the command stops with its traceback
            raise TrialCrashed(self.name, trial.number) from error
        trial.set_user_attr("overrides", overrides)
        trial.set_user_attr("scores", scores)
        trial.set_user_attr("processes", accelerator.num_processes)
        value = sum(scores) / len(scores)
        self.log(f"[tune] trial {trial.number}: {value:.2f} (seeds {scores}) in "
                 f"{time.perf_counter() - started:.0f}s with {overrides}")
        return value

    def follow(self) -> None:
        """Processes other than 0 of a launch: run whatever trial process 0 broadcasts.
        They never open the storage; a trial that stops (pruned, or failed: process 0's
        ``run_trial`` records it and goes on) stops here alike, and the next one follows."""
        import optuna

        while True:
            message = broadcast(None, self.runner.accelerator)
            if message[0] == "stop":
                return
            try:
                with contextlib.suppress(optuna.TrialPruned, RuntimeError):
                    self.evaluate(message[1])
            except (StoreNotWritableError, InvalidRecordError):
                # Process 0 stops on it too: take its message.
                broadcast(None, self.runner.accelerator)
                raise

    # -- driving a study -----------------------------------------------------------------
    def counts(self, study=None) -> dict[str, int]:
        from optuna.trial import TrialState

        study = study or self.study()
        counts = {state.name.lower(): 0 for state in TrialState}
        for trial in study.get_trials(deepcopy=False):
            counts[trial.state.name.lower()] += 1
        return counts

    def failed(self, study) -> int:
        """Trials whose runs failed (a diverged run, say): not those of a worker that died
        or was interrupted, which say nothing about their parameters."""
        return sum(1 for trial in study.get_trials(deepcopy=False)
                   if trial.state.name == "FAIL" and "error" in trial.user_attrs)

    def run_trial(self, study) -> None:
        """One trial (a re-queued one first), with the worker's heartbeat.

        Ctrl-C in a trial (Optuna fails it) queues its parameters again, as the storage's
        retry callback does for a dead worker's trial, and raises TuningInterrupted: the
        trial says nothing about its parameters, and one worker alone must repeat its
        study, so the next trial of the study runs them rather than drawing new ones.
        An unexpected error other than a RuntimeError (a bug: TrialCrashed) queues its
        parameters again alike and stops the study, its traceback printed by the command.
        The objective reports a failed run itself, and the Ctrl-C and a bug are reported
        by the command: Optuna logs none of them (see quiet_reported_failures)."""
        self._running = None
        self._interrupted = False
        try:
            with quiet_reported_failures():
                study.optimize(self._noting_interrupts, n_trials=1, catch=(RuntimeError,))
        except KeyboardInterrupt:
            raise TuningInterrupted(self.name, self._retry_interrupted(study)) from None
        except TrialCrashed as crashed:
            crashed.queued = self._retry_interrupted(study) is not None
            raise
        except Exception:
            if not self._interrupted:
                raise
            # Ctrl-C stopped the trial, then Optuna's own record of its failure failed (the
            # storage busy: "database is locked"); the trial is failed and queued here.
            raise TuningInterrupted(self.name, self._retry_interrupted(study)) from None

    def _noting_interrupts(self, trial) -> float:
        try:
            return self.objective(trial)
        except KeyboardInterrupt:
            self._interrupted = True
            raise

    def _retry_interrupted(self, study, attempts: int = 5) -> int | None:
        """Queue the parameters of the trial Ctrl-C stopped again; its number (None: no
        trial of this process was running, or its retries are used up).  A storage that is
        busy (another process writing to SQLite) is asked again, a second apart."""
        from sqlalchemy.exc import OperationalError

        for attempt in range(attempts):
            try:
                return self._queue_interrupted_again(study)
            except OperationalError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
        return None

    def _queue_interrupted_again(self, study) -> int | None:
        from optuna.trial import TrialState

        if self._running is None:
            return None
        storage = study._storage
        trial = storage.get_trial(self._running)
        if trial.state == TrialState.RUNNING:  # stopped before Optuna could fail it
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
            trial = storage.get_trial(trial._trial_id)
        if trial.state != TrialState.FAIL:  # it had finished
            return None
        before = len(study.get_trials(deepcopy=False))
        _retry(study, trial)
        return trial.number if len(study.get_trials(deepcopy=False)) > before else None

    def optimize(self, trials: int, poll_seconds: float | None = None,
                 reclaim_local: bool = True) -> None:
        """Add trials until the study has ``trials`` finished (complete or pruned) ones, or
        until as many trials' runs have failed (a study whose every trial fails would
        otherwise never stop); waits for other workers' running trials (a dead worker's
        are failed after the grace period and re-queued)."""
        from optuna.storages import fail_stale_trials

        accelerator = self.runner.accelerator
        if not accelerator.is_main_process:
            self.follow()
            return
        study = self.study()
        self.log(f"[tune] study {self.name} on {mask_url(self.storage_url)}")
        try:
            while True:
                fail_stale_trials(study)
                if reclaim_local:
                    fail_dead_local_trials(study)
                counts = self.counts(study)
                finished = counts["complete"] + counts["pruned"]
                if finished >= trials and not counts["waiting"]:
                    break
                failed = self.failed(study)
                if failed >= trials:
                    self.log(f"[tune] {self.name}: stopping: the runs of {failed} trials "
                             f"failed, as many as the {trials} trials asked for (their "
                             f"errors are above; their records under "
                             f"{self.runner.store.root})")
                    break
                if counts["waiting"] or finished + counts["running"] < trials:
                    self.run_trial(study)
                else:
                    time.sleep(poll_seconds or max(1.0, HEARTBEAT_SECONDS / 2))
        finally:
            broadcast(("stop",), accelerator)
        counts = self.counts(study)
        self.log(f"[tune] {self.name}: {counts['complete']} complete, {counts['pruned']} "
                 f"pruned, {counts['fail']} failed")

    def write_best(self, study=None) -> Path:
        """The best trial's overrides as a parameter file ``run`` and ``grid`` accept;
        a RuntimeError when no trial completed."""
        study = study or self.study()
        counts = self.counts(study)
        if not counts["complete"]:
            errors = [str(trial.user_attrs["error"]) for trial in
                      study.get_trials(deepcopy=False) if "error" in trial.user_attrs]
            raise RuntimeError(
                f"study {self.name}: no complete trial to take parameters from "
                f"({counts['fail']} failed, {counts['pruned']} pruned, {counts['running']} "
                f"running); no parameters written"
                + (f". The last failed trial: {errors[-1]}" if errors else ""))
        best = study.best_trial
        document = {
            "study": self.name,
            "suite": self.suite.record_suite,
            "method": self.target.method,
            "task": self.target.task,
            "seeds": self.target.seeds,
            "student": self.target.student,
            "task_epochs": self.target.task_epochs,
            "storage": mask_url(self.storage_url),
            "objective": {"metric": "dev main metric, mean over seeds", "value": best.value,
                          "trial": best.number, "scores": best.user_attrs.get("scores")},
            "trials": {"complete": counts["complete"], "pruned": counts["pruned"],
                       "failed": counts["fail"]},
            "recipe": next(({"trial": trial.number, "value": trial.value,
                             "params": trial.params}
                            for trial in study.get_trials(deepcopy=False)
                            if trial.user_attrs.get("recipe")), None),
            "overrides": best.user_attrs["overrides"],
            # every trial, pruned ones included (their runs leave no record)
            "history": [{"trial": trial.number, "state": trial.state.name.lower(),
                         "value": trial.value, "params": trial.params,
                         "evaluations": [trial.intermediate_values[step]
                                         for step in sorted(trial.intermediate_values)]}
                        for trial in study.get_trials(deepcopy=False)],
        }
        path = tuned_path(self.results, self.name)
        # Other workers read it as it lands (load_tuned): never half a file.
        write_text_atomic(path, yaml.safe_dump(document, sort_keys=False))
        return path


def search_space_source(method: Method) -> str:
    """Where ``method``'s search space is written: its plugin's file and line (relative
    to the working folder when inside it), else its module's name."""
    location = code_location(type(method).search_space)
    if location is None:
        return type(method).__module__
    path, line = location
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"{shown}:{line}"


def override_problem(method: Method, task: str, key: str) -> str | None:
    """What is wrong with the form of the dotted override ``key`` for ``method`` on
    ``task``, naming what is valid there (None: nothing). Its value is not checked."""
    root, *rest = key.split(".")
    if root not in OVERRIDE_ROOTS or not rest or not all(rest):
        return ("not a recipe override; expected params.<name>, stages.<stage>.<field> or "
                "loss_weights.<term>")
    if root == "params":
        names = sorted(type(method.params).model_fields)
        if rest[0] not in names:
            return (f"{method.name} has no parameter {rest[0]!r}; its parameters: "
                    f"{', '.join(names) or 'none'}")
    elif root == "stages":
        stages = list(method.stage_names or
                      [stage.name for stage in method.stages(get_task(task))])
        if len(rest) != 2:
            return f"expected stages.<stage>.<field>, <stage> one of {', '.join(stages)}"
        if rest[0] not in stages:
            return f"{method.name} has no stage {rest[0]!r}; its stages: {', '.join(stages)}"
        fields = list(TrainOverride.model_fields)
        if rest[1] not in fields:
            return (f"a stage has no training setting {rest[1]!r}; the settings: "
                    f"{', '.join(fields)}")
    else:
        terms = [term.name for term in method.loss_terms]
        if len(rest) != 1 or rest[0] not in terms:
            return (f"{method.name} has no loss term {'.'.join(rest)!r}; its terms: "
                    f"{', '.join(terms)}")
    return None


def tuned_path(results: Path, study: str) -> Path:
    """``<results>/tuned/<study>.yaml``; a study name that would lead out of it is refused
    (:class:`~harness.common.paths.PathEscapeError`)."""
    return contained(results, TUNED_DIR, f"{study}.yaml")


@dataclass(frozen=True)
class TunedParams:
    """A parameter file written by `harness tune`: overrides for one method on one task."""

    path: Path
    study: str
    suite: str
    method: str
    task: str
    overrides: dict[str, Any]
    student: str | None = None
    """The suite student shape the study tuned on (None: the method's own); the runs that
    use the parameters train it, since parameters tuned for one shape say nothing of
    another's."""

    def annotation(self) -> dict[str, Any]:
        return {"study": self.study, "file": str(self.path)}


def load_tuned(reference: str, results: Path) -> TunedParams:
    """A parameter file by path, or by study name (under ``<results>/tuned/``)."""
    path = Path(reference)
    if not path.is_file():
        try:
            path = tuned_path(results, reference)
        except PathEscapeError:
            raise FileNotFoundError(f"--params {reference}: neither a file nor a study "
                                    "name (one name, no folders)") from None
    if not path.is_file():
        raise FileNotFoundError(f"--params {reference}: neither a file nor a study with "
                                f"written parameters ({path}); run `harness tune` first")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    missing = [key for key in ("method", "task", "overrides") if key not in (document or {})]
    if missing:
        raise ConfigError(f"{path}: not a tuned-parameter file (missing {', '.join(missing)})")
    if not isinstance(document["overrides"], dict):
        raise ConfigError(f"{path}: overrides: expected a mapping of dotted keys to values")
    student = document.get("student")
    if student is not None and not isinstance(student, str):
        raise ConfigError(f"{path}: student: expected the name of a suite student shape")
    return TunedParams(path=path, study=str(document.get("study", path.stem)),
                       suite=str(document.get("suite", "")), method=str(document["method"]),
                       task=str(document["task"]), overrides=dict(document["overrides"]),
                       student=student)


def fail_dead_local_trials(study) -> int:
    """Fail (and re-queue) running trials of workers on this host whose process is gone,
    without waiting out the heartbeat grace period: a grid restarted after a kill on one
    machine resumes at once."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    storage = study._storage
    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get("worker", ""))
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except Exception:  # another worker failed it first
            continue
        failed += 1
        _retry(study, storage.get_trial(trial._trial_id))
    return failed


def _retry(study, trial) -> None:
    """Queue a failed ``trial``'s parameters again through the storage's heartbeat retry
    callback (see :func:`open_storage`): what a worker that finds a dead worker's trial
    does, up to ``MAX_RETRIES`` times."""
    callback = study._storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
        callback(study, trial)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _RecordingTrial:
    """Stands in for an Optuna trial to read a search space: records each suggestion's
    name and distribution, in call order, and answers with a value inside it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        from optuna.distributions import FloatDistribution

        self.calls.append((name, FloatDistribution(low, high, step=step, log=log)))
        return low

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        from optuna.distributions import IntDistribution

        self.calls.append((name, IntDistribution(low, high, step=step, log=log)))
        return low

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        from optuna.distributions import CategoricalDistribution

        self.calls.append((name, CategoricalDistribution(list(choices))))
        return next(iter(choices))
