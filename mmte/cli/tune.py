"""``mmte tune``: search a recipe's settings on the validation split with Optuna.

::

    mmte tune --config recipes/quickstart.yaml [fragments and flags every trial gets] \\
              --tune.space space.yaml --tune.trials 20 [--tune.jobs 2] [--tune.metric val_acc --tune.mode max] \\
              [--tune.storage runs/tune/study.db] [--tune.out runs/tune/quickstart]

Every ``--tune.*`` option is tune's; everything else is passed to each trial's ``mmte fit``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from ..errors import UnknownNameError, UsageError

__all__ = ["split_argv", "tune_main"]

logger = logging.getLogger("mmte")

_MAXIMISED = ("acc", "r1", "f1", "auroc", "precision", "recall")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmte tune", add_help=False, exit_on_error=False)
    p.add_argument("--tune.space", dest="space", required=True, help="YAML search space: {recipe key: range or choices}")
    p.add_argument("--tune.trials", dest="trials", type=int, required=True, help="trials in the study (a resumed study runs the missing ones)")
    p.add_argument("--tune.jobs", dest="jobs", type=int, default=1, help="trials run at once (the cores are split between them)")
    p.add_argument("--tune.metric", dest="metric", default="val_loss", help="validation metric to optimise (val_acc, val_loss, val_mse...)")
    p.add_argument("--tune.mode", dest="mode", default=None, help="max or min (default: max for accuracy/recall metrics, else min)")
    p.add_argument("--tune.storage", dest="storage", default=None, help="SQLite file/URL or journal file (default: <out>/study.db)")
    p.add_argument("--tune.study", dest="study", default="mmte-tune", help="study name inside the storage")
    p.add_argument("--tune.out", dest="out", default=None, help="folder for trials/, best.yaml, trials.csv, plots (default: runs/tune/<recipe>)")
    p.add_argument("--tune.sampler", dest="sampler", default="tpe", help="tpe, random or grid (grid: choices only)")
    p.add_argument("--tune.pruner", dest="pruner", default="median", help="median or none")
    p.add_argument("--tune.startup_trials", dest="startup_trials", type=int, default=2, help="trials the median pruner never prunes")
    p.add_argument("--tune.warmup_steps", dest="warmup_steps", type=int, default=0, help="validations of each trial the pruner waits for")
    p.add_argument("--tune.seed", dest="seed", type=int, default=0, help="the sampler's seed")
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(tune's --tune.* arguments, the arguments every trial's mmte fit gets)``."""
    mine, rest = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--tune."):
            mine.append(a)
            if "=" not in a and i + 1 < len(argv):
                mine.append(argv[i + 1])
                i += 1
        else:
            rest.append(a)
        i += 1
    return mine, rest


def _options(argv: Sequence[str]):
    from ..tune.space import load_space
    from ..tune.study import TuneOptions

    mine, base = split_argv(argv)
    parser = _parser()
    known = [a.option_strings[0] for a in parser._actions]
    for a in mine:
        if a.startswith("--tune.") and a.split("=", 1)[0] not in known:
            raise UnknownNameError("option", a.split("=", 1)[0], known, "see mmte tune --help")
    try:
        ns = parser.parse_args(mine)
    except argparse.ArgumentError as e:
        raise UsageError(f"mmte tune: {e}", "expected --tune.space <yaml> --tune.trials <N>", "see mmte tune --help") from None
    if not any(a == "--config" or a.startswith("--config=") or a == "-c" for a in base):
        raise UsageError("mmte tune needs a recipe", "expected --config <recipe.yaml>", "e.g. mmte tune --config recipes/quickstart.yaml ...")
    for name in ("trials", "jobs"):
        if getattr(ns, name) < 1:
            raise UsageError(f"--tune.{name} is {getattr(ns, name)}", "expected an int >= 1")
    mode = ns.mode or ("max" if ns.metric.rsplit("_", 1)[-1] in _MAXIMISED else "min")
    for flag, value, choices in (("mode", mode, ("max", "min")), ("sampler", ns.sampler, ("tpe", "random", "grid")), ("pruner", ns.pruner, ("median", "none"))):
        if value not in choices:
            raise UnknownNameError(f"--tune.{flag}", value, choices)
    if not ns.metric.startswith("val_"):
        raise UsageError(f"--tune.metric {ns.metric} is not a validation metric", "expected a val_* metric (val_acc, val_loss...)",
                         "tune on validation; the test split is read once, by mmte test")
    configs = [base[i + 1] for i, a in enumerate(base[:-1]) if a in ("--config", "-c")] + [a.split("=", 1)[1] for a in base if a.startswith("--config=")]
    from .checks import check_config_files

    check_config_files(base)
    out = ns.out or os.path.join("runs", "tune", os.path.splitext(os.path.basename(configs[0]))[0])
    return TuneOptions(space=load_space(ns.space), trials=ns.trials, out=out, metric=ns.metric, mode=mode, jobs=ns.jobs, storage=ns.storage,
                       study=ns.study, sampler=ns.sampler, pruner=ns.pruner, startup_trials=ns.startup_trials, warmup_steps=ns.warmup_steps,
                       seed=ns.seed, base=list(base))


def tune_main(argv: Sequence[str]) -> int:
    """``mmte tune``: run the study, write ``best.yaml``, ``trials.csv`` and the plots; returns the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print((__doc__ or "").strip() + "\n\noptions:\n" + _parser().format_help().split("options:", 1)[-1].strip())
        return 0
    opts = _options(argv)
    import optuna

    from ..tune.outputs import write_outputs
    from ..tune.study import run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # mmte logs one line per trial itself
    study = run_study(opts)
    written = write_outputs(study, opts.out)
    best = study.best_trial
    logger.info("best: trial %d, %s %.6g; wrote %s, %s and %d plots", best.number, opts.metric, best.value, written["best"], written["trials"],
                len(written["plots"]))
    print(written["best"])
    return 0
