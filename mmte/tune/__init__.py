"""Tuning a recipe's settings on the validation split with Optuna (``mmte tune``).

Each trial is a real ``mmte fit`` process (:mod:`mmte.tune.trial`) with the values Optuna drew from the
search space (:mod:`mmte.tune.space`); :class:`mmte.tune.callback.OptunaPruning` reports its validation
metric to the study's storage (:mod:`mmte.tune.storage`) and stops it early when the pruner says so.
:mod:`mmte.tune.study` runs and resumes the study; :mod:`mmte.tune.outputs` writes ``best.yaml``,
``trials.csv`` and the plots. The test split is never read: ``mmte test`` on the best recipe gives
the one test figure. This package imports Optuna, not Lightning (except the callback module, which
runs inside the trial's process).
"""

__all__ = ["TuneOptions", "parse_space", "run_study", "write_outputs"]


def __getattr__(name: str):
    if name in ("TuneOptions", "run_study"):
        from . import study

        return getattr(study, name)
    if name == "parse_space":
        from .space import parse_space

        return parse_space
    if name == "write_outputs":
        from .outputs import write_outputs

        return write_outputs
    raise AttributeError(f"module 'mmte.tune' has no attribute {name!r}")
