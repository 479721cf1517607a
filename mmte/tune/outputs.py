"""What ``mmte tune`` writes to ``--tune.out``: ``best.yaml``, ``trials.csv`` and the plots of the search.

``best.yaml`` is the merged recipe the best trial ran (``mmte fit`` saved it beside its logs), the
trial's values included and the tuning callback taken out, with the best trial's folder as
``trainer.default_root_dir``: ``mmte test --config best.yaml --ckpt_path best`` gives its one test figure,
and ``mmte fit --config best.yaml`` (same seed) trains the same model again.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from ..errors import RunError

__all__ = ["write_best", "write_outputs", "write_plots", "write_table"]

logger = logging.getLogger("mmte")


def _saved_config(folder: str) -> str:
    found = sorted(glob.glob(os.path.join(folder, "**", "config.yaml"), recursive=True), key=os.path.getmtime)
    if not found:
        raise RunError(f"the best trial's folder {folder} holds no config.yaml", "expected the recipe mmte fit saves beside its logs",
                       "keep trainer.logger on (or save_config) for tuned recipes")
    return found[-1]


def write_best(study: Any, path: str) -> str:
    """Write the best trial's recipe to ``path``; returns the path."""
    import yaml

    best = study.best_trial
    folder = best.user_attrs["folder"]
    with open(_saved_config(folder), encoding="utf-8") as fh:
        cfg = yaml.safe_load(fh)
    trainer = cfg.get("trainer") or {}
    callbacks = trainer.get("callbacks") or []
    callbacks = [c for c in (callbacks if isinstance(callbacks, list) else [callbacks])
                 if not (isinstance(c, dict) and str(c.get("class_path", "")).endswith("tune.callback.OptunaPruning"))]
    trainer["callbacks"] = callbacks or None
    cfg.pop("threads", None)  # the trial's share of the cores; the recipe takes the machine's default
    # what mmte filled in for the trial (its default logger, the checkpoint folder) is derived again from
    # default_root_dir, so `mmte fit --config best.yaml --trainer.default_root_dir <dir>` writes only to <dir>
    logger_cfg = trainer.get("logger")
    if isinstance(logger_cfg, dict) and os.path.abspath(str((logger_cfg.get("init_args") or {}).get("save_dir", ""))) == os.path.abspath(folder):
        trainer["logger"] = None
    if isinstance(cfg.get("checkpoint"), dict):
        cfg["checkpoint"]["dirpath"] = None
    metric = study.user_attrs.get("metric", "value")
    header = [f"# mmte tune: trial {best.number} of study {study.study_name!r}, best {metric} {best.value:.6g} (validation split)",
              *(f"#   {k}: {v!r}" for k, v in best.params.items()),
              "# test it once:  mmte test --config <this file> --ckpt_path best",
              "# train it again (same seed): mmte fit --config <this file> [--trainer.default_root_dir <another folder>]"]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(header) + "\n")
        yaml.safe_dump(cfg, fh, sort_keys=False)
    return path


def write_table(study: Any, path: str) -> str:
    """Every trial of the study as one CSV row (number, state, value, params, start and duration)."""
    df = study.trials_dataframe(attrs=("number", "state", "value", "params", "datetime_start", "duration", "user_attrs"))
    df.to_csv(path, index=False)
    return path


def write_plots(study: Any, folder: str) -> list[str]:
    """Optuna's plots of the search: HTML (plotly) and PNG (matplotlib), those the study has the trials for."""
    import optuna

    written = []
    names = ["plot_optimization_history", "plot_intermediate_values", "plot_parallel_coordinate", "plot_param_importances"]
    for name in names:
        stem = os.path.join(folder, name.removeprefix("plot_"))
        try:
            getattr(optuna.visualization, name)(study).write_html(stem + ".html")
            written.append(stem + ".html")
        except (ImportError, ValueError, RuntimeError) as e:
            logger.info("no %s.html: %s", name, e)
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            ax = getattr(optuna.visualization.matplotlib, name)(study)
            fig = (ax.flat[0] if hasattr(ax, "flat") else ax).get_figure()
            fig.savefig(stem + ".png", bbox_inches="tight")
            written.append(stem + ".png")
            import matplotlib.pyplot as plt

            plt.close(fig)
        except (ImportError, ValueError, RuntimeError) as e:
            logger.info("no %s.png: %s", name, e)
    return written


def write_outputs(study: Any, out: str) -> dict[str, Any]:
    """``best.yaml``, ``trials.csv`` and the plots in ``out``; returns ``{"best": path, "trials": path, "plots": [...]}``."""
    import warnings

    from optuna.trial import TrialState

    os.makedirs(out, exist_ok=True)
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        table = write_table(study, os.path.join(out, "trials.csv"))
        raise RunError(f"no trial of study {study.study_name!r} completed (see {table})", "expected at least one trial to finish unpruned",
                       "look at the trials' fit.log, or run more trials")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna's experimental-feature notes about its matplotlib plots
        plots = write_plots(study, out)
    return {"best": write_best(study, os.path.join(out, "best.yaml")), "trials": write_table(study, os.path.join(out, "trials.csv")), "plots": plots}
