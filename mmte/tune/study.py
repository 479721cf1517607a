"""The study of ``mmte tune``: pre-flight check, the Optuna study (created or resumed), the trials.

Protocol: every trial is scored on the validation split (the best value of ``metric`` over its
validations); the test split is never read. A study killed part-way continues from its storage: the
trials that finished keep their results, a trial that was running is run again with the values it had
drawn (its grid point, for the grid sampler), and the pre-flight run is not repeated when the command and
the recipe files are those it passed for.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import Interrupted, RunError, UsageError
from .space import first_value, suggest
from .storage import PRUNED_ATTR, PRUNER_ATTR, open_storage, storage_url
from .trial import TrialProcesses, fit_command, last_error_line, validate_command

__all__ = ["TuneOptions", "run_study"]

logger = logging.getLogger("mmte")

_ERROR_ATTR = "error"  # a trial that failed by itself (not interrupted) carries its one-line reason
_CHECKED_ATTR = "preflight_passed"  # the study's command_fingerprint whose pre-flight run passed


@dataclass
class TuneOptions:
    """What ``--tune.*`` sets (see ``mmte tune --help``)."""

    space: dict[str, Any]
    trials: int
    out: str
    metric: str = "val_loss"
    mode: str = "min"
    jobs: int = 1
    storage: str | None = None
    study: str = "mmte-tune"
    sampler: str = "tpe"
    pruner: str = "median"
    startup_trials: int = 2
    warmup_steps: int = 0
    seed: int = 0
    base: list[str] = field(default_factory=list)  # the recipe and flags every trial gets

    @property
    def storage_url(self) -> str:
        return storage_url(self.storage or os.path.join(self.out, "study.db"))


class _TrialFailed(Exception):
    """A trial whose ``mmte fit`` failed by itself; the study goes on."""


def threads_per_trial(jobs: int) -> int:
    """The cores each of ``jobs`` concurrent trials gets (at least 1)."""
    from ..device import cpu_info

    return max(1, cpu_info().physical_cores // max(1, jobs))


def preflight(opts: TuneOptions) -> None:
    """One ``mmte validate`` run on one validation batch with each key at a value of its range: an unknown key,
    a value the recipe refuses or a metric it does not log is one UsageError before any trial starts."""
    folder = os.path.join(opts.out, "preflight")
    values = {k: first_value(d) for k, d in opts.space.items()}
    procs = TrialProcesses()
    try:
        code = procs.run(validate_command(opts.base, values, folder, opts.metric), os.path.join(folder, "validate.log"))
        with open(os.path.join(folder, "validate.log"), encoding="utf-8") as fh:
            log = fh.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if code == 0:
        return
    msg = last_error_line(log)
    if msg is None:
        tail = " | ".join(log.strip().splitlines()[-3:])
        raise RunError(f"the pre-flight mmte validate run failed (exit status {code}): {tail}", "expected the recipe to build and validate")
    keys = [k for k in opts.space if f"--{k}" in msg or k in msg]
    raise UsageError(f"--tune.space {keys[0]}: {msg}" if keys else msg)


def command_fingerprint(opts: TuneOptions) -> str:
    """A digest of what the pre-flight checks: the space, the metric, the flags every trial gets and the
    contents of the ``--config`` files they name."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps([sorted((k, repr(d)) for k, d in opts.space.items()), opts.metric, opts.base]).encode())
    for i, arg in enumerate(opts.base):
        path = opts.base[i + 1] if arg in ("--config", "-c") and i + 1 < len(opts.base) else arg.split("=", 1)[1] if arg.startswith("--config=") else None
        if path is not None and os.path.isfile(path):
            with open(path, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()


def _stored_attr(opts: TuneOptions, key: str) -> Any:
    """The study's user attribute ``key`` when its storage and the study exist already (nothing is created)."""
    url = opts.storage_url
    for prefix in ("sqlite:///", "journal:"):
        if url.startswith(prefix) and not os.path.isfile(url[len(prefix):]):
            return None
    import optuna

    try:
        return optuna.load_study(study_name=opts.study, storage=open_storage(url)).user_attrs.get(key)
    except KeyError:  # no study of that name in the storage
        return None


def _make_sampler(opts: TuneOptions) -> Any:
    import optuna

    if opts.sampler == "grid":
        grid = {}
        for k, d in opts.space.items():
            if not hasattr(d, "choices"):
                raise UsageError(f"--tune.sampler grid: {k} is a range", "expected only {choice: [...]} entries in a grid space",
                                 "write the values as choices, or use --tune.sampler tpe")
            grid[k] = list(d.choices)
        return optuna.samplers.GridSampler(grid, seed=opts.seed)
    if opts.sampler == "random":
        return optuna.samplers.RandomSampler(seed=opts.seed)
    return optuna.samplers.TPESampler(seed=opts.seed)


def open_study(opts: TuneOptions, sampler: Any = None) -> Any:
    """Create the study or load it from its storage, checking a loaded one tunes the same metric
    (``sampler``: one :func:`_make_sampler` already built from ``opts``, else it is built here)."""
    import optuna

    from .storage import make_pruner

    direction = "maximize" if opts.mode == "max" else "minimize"
    storage = open_storage(opts.storage_url)
    study = optuna.create_study(storage=storage, study_name=opts.study, direction=direction, load_if_exists=True,
                                sampler=sampler or _make_sampler(opts), pruner=make_pruner(_pruner_settings(opts)))
    known = study.user_attrs.get("metric")
    if known is not None and (known != opts.metric or study.direction.name.lower() != direction):
        raise UsageError(f"study {opts.study!r} in {opts.storage_url} tunes {known} ({study.direction.name.lower()})",
                         f"expected --tune.metric {known} --tune.mode {'max' if study.direction.name == 'MAXIMIZE' else 'min'} to resume it",
                         "or name another --tune.study / --tune.storage")
    study.set_user_attr("metric", opts.metric)
    study.set_user_attr(PRUNER_ATTR, _pruner_settings(opts))
    study.set_user_attr("space", sorted(opts.space))
    return study


def _pruner_settings(opts: TuneOptions) -> dict[str, Any]:
    return {"name": opts.pruner, "startup_trials": opts.startup_trials, "warmup_steps": opts.warmup_steps}


def _retried(study: Any) -> set[int]:
    """The numbers of the trials already queued again: every number in a retry's history."""
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        return {n for t in study.get_trials(deepcopy=False) for n in RetryHeartbeatStaleTrialCallback.retry_history(t)}


def requeue_interrupted(study: Any) -> int:
    """Queue again the trials an earlier (killed or stopped) ``mmte tune`` left unfinished; returns how many
    trials of the study are done (complete, pruned, or failed by themselves).

    A trial can be cut at any point: before Optuna gave it its values, after some of them, or while its
    ``mmte fit`` ran. Optuna's :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` queues a copy carrying
    the values drawn so far and the sampler's own marks (the grid point of ``GridSampler``), so the copy
    runs the same point and draws only what is missing. The copy's retry history names the trial, which
    is how a later resume knows it was already queued (the copy and that record are one storage write).
    """
    from optuna.exceptions import ExperimentalWarning
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):  # its mmte tune is gone (one tune per study at a time)
        study.tell(t.number, state=TrialState.FAIL)
    retried = _retried(study)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback()
    done = 0
    for t in study.get_trials(deepcopy=True):
        if t.state == TrialState.FAIL and _ERROR_ATTR in t.user_attrs or t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            done += 1
        elif t.state == TrialState.FAIL and t.number not in retried:
            t.user_attrs = {}  # the copy starts afresh: none of the interrupted run's marks (its folder, a pruning note)
            retry(study, t)
            logger.info("trial %d was interrupted; it runs again with the values it had drawn", t.number)
    return done


def _read_trial(opts: TuneOptions, number: int) -> Any:
    store = open_storage(opts.storage_url)
    return store.get_trial(store.get_trial_id_from_study_id_trial_number(store.get_study_id_from_name(opts.study), number))


def _score(values: dict[int, float], mode: str) -> float:
    return max(values.values()) if mode == "max" else min(values.values())


def run_study(opts: TuneOptions) -> Any:
    """Pre-flight (unless it passed for the same command and recipe files: a resumed study), then the trials
    still missing from the study; returns the study."""
    import optuna

    sampler = _make_sampler(opts)  # a space the sampler cannot take is one error line before the pre-flight run
    checked = command_fingerprint(opts)
    if _stored_attr(opts, _CHECKED_ATTR) == checked:
        logger.info("the pre-flight run passed for this study's command and recipe files before; not repeated")
    else:
        preflight(opts)
    study = open_study(opts, sampler)
    study.set_user_attr(_CHECKED_ATTR, checked)
    done = requeue_interrupted(study)
    todo = max(0, opts.trials - done)
    threads = threads_per_trial(min(opts.jobs, max(todo, 1)))
    logger.info("tuning %s (%s) over %d keys: %d trials done, %d to run, %d at once with %d threads each; study %s in %s",
                opts.metric, opts.mode, len(opts.space), done, todo, opts.jobs, threads, opts.study, opts.storage_url)
    procs = TrialProcesses()

    def objective(trial: optuna.trial.Trial) -> float:
        values = {k: suggest(trial, k, d) for k, d in opts.space.items()}
        folder = os.path.abspath(os.path.join(opts.out, "trials", str(trial.number)))
        trial.set_user_attr("folder", folder)
        cmd = fit_command(opts.base, values, folder, threads, opts.metric, opts.storage_url, opts.study, trial.number)
        log_path = os.path.join(folder, "fit.log")
        logger.info("trial %d: %s", trial.number, " ".join(f"{k}={v}" for k, v in values.items()))
        code = procs.run(cmd, log_path)
        if procs.stopped is not None or code in (130, 143) or code < 0:
            raise Interrupted(procs.stopped or (code - 128 if code > 128 else -code))
        frozen = _read_trial(opts, trial.number)  # as the trial's process wrote it
        if code != 0:
            with open(log_path, encoding="utf-8") as fh:
                reason = last_error_line(fh.read()) or f"mmte fit exited with status {code}"
            trial.set_user_attr(_ERROR_ATTR, reason)
            logger.warning("trial %d failed: %s (see %s)", trial.number, reason, log_path)
            raise _TrialFailed(reason)
        if not frozen.intermediate_values:
            reason = f"no {opts.metric} was reported (no validation ran)"
            trial.set_user_attr(_ERROR_ATTR, reason)
            raise _TrialFailed(reason)
        if PRUNED_ATTR in frozen.user_attrs:
            logger.info("trial %d pruned after validation %d", trial.number, frozen.user_attrs[PRUNED_ATTR])
            raise optuna.TrialPruned()
        value = _score(frozen.intermediate_values, opts.mode)
        logger.info("trial %d: %s %.6g", trial.number, opts.metric, value)
        return value

    if todo:
        restore = procs.install()
        try:
            study.optimize(objective, n_trials=todo, n_jobs=opts.jobs, catch=(_TrialFailed,))
        finally:
            restore()
    return study
