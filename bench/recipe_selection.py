"""Shipped recipes re-selected with ``mmte tune`` on validation, each read on its test split once.

For each recipe, a study made by the command written at the top of ``recipes/tune/<recipe>.space.yaml``
(its search space) leaves ``trials.csv`` and ``best.yaml`` in ``runs/tune/<recipe>/``. Then, once:

* ``--test``: ``mmte test`` on the best trial's checkpoint (``best.yaml``, ``--ckpt_path best``), and the
  simple baselines of ``bench/generalisation.py`` on the same test rows (forecast: repeat-last, the
  per-channel least squares and the least squares with the recipe's cycle; tabular: scikit-learn's
  HistGradientBoosting and a logistic regression). Stored in ``bench/results/recipe_selection.json``.
* ``--update-doc``: the ``recipe-selection`` section of BENCHMARKS.md from the stored results and the
  studies' ``trials.csv``: per recipe the budget, the space, the best validation value, the test figure,
  the baselines and the figure of the earlier, test-selected recipe.

::

    python bench/recipe_selection.py --test etth1_forecast diamonds_tabular   # the one test figure each
    python bench/recipe_selection.py --update-doc                              # the table, from what is stored
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc

RESULTS = ROOT / "bench" / "results" / "recipe_selection.json"
DATA = ROOT.parent / "shared" / "data"

#: per recipe: the tuned metric, the test metric, the flags of the test run (the test protocol of
#: bench/generalisation.py) and the figure of the recipe as it was before, chosen by looking at the test split
RECIPES = {
    "etth1_forecast": {
        "family": "forecast", "metric": "val_mse", "test_metric": "test_mse",
        "test_flags": ["--data.init_args.path", str(DATA / "ett" / "ETTh1.csv"), "--data.init_args.horizon", "96",
                       "--data.init_args.train_step", "1", "--data.init_args.eval_step", "1"],
        "old": 0.3615, "old_note": "MSE@96, bench/generalisation.py, 2026-12-06; lr and dropout compared on the test months",
    },
    "diamonds_tabular": {
        "family": "tabular", "metric": "val_acc", "test_metric": "test_acc",
        "test_flags": ["--data.init_args.path", str(DATA / "tabular" / "diamonds.csv"), "--data.init_args.label_column", "cut",
                       "--data.init_args.test_fraction", "0.2"],
        "old": 0.8035, "old_note": "accuracy after ~32 early-stopped epochs, bench/generalisation.py, 2026-12-03; trunk and lr compared on the test rows",
    },
}


def tune_dir(name: str) -> Path:
    return ROOT / "runs" / "tune" / name


def space_file(name: str) -> Path:
    return ROOT / "recipes" / "tune" / f"{name}.space.yaml"


def study_summary(name: str) -> dict:
    """The study's trials by state, the best trial's number, value and values (from ``trials.csv``)."""
    rows = list(csv.DictReader((tune_dir(name) / "trials.csv").read_text().splitlines()))
    spec = RECIPES[name]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    best = (min if spec["metric"].endswith(("mse", "loss", "mae")) else max)(done, key=lambda r: float(r["value"]))
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    return {"trials": len(rows), "states": states, "best_trial": int(best["number"]), "best_value": float(best["value"]),
            "best_params": {k[len("params_"):]: v for k, v in best.items() if k.startswith("params_")}}


def baselines(name: str, dm) -> dict:
    """The simple baselines of bench/generalisation.py on the data module's test rows."""
    from bench import generalisation as g

    if RECIPES[name]["family"] == "forecast":
        b = g.linear_baselines(dm)
        out = {"repeat-last": b["repeat_last"]["mse"], "least squares": b["linear"]["mse"]}
        if "linear_cycle" in b:
            out["least squares + cycle"] = b["linear_cycle"]["mse"]
        return out
    b = g.tabular_baselines(dm, str(DATA / "tabular" / "diamonds.csv"), "cut")
    return {"HistGradientBoosting": b["hist_gradient_boosting"], "logistic regression": b["logistic_regression"]}


def test_once(name: str) -> dict:
    """``mmte test --config best.yaml --ckpt_path best`` (the study's best trial), in this process; and the baselines."""
    from mmte.cli import MMTECLI

    spec = RECIPES[name]
    t0 = time.time()
    argv, sys.argv = sys.argv, sys.argv[:1]  # the script's own options are not the CLI's
    try:
        cli = MMTECLI(args=["test", "--config", str(tune_dir(name) / "best.yaml"), *spec["test_flags"], "--ckpt_path", "best",
                            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    finally:
        sys.argv = argv
    return {"test": float(cli.trainer.callback_metrics[spec["test_metric"]]), "checkpoint": str(cli.trainer.ckpt_path), "test_s": round(time.time() - t0),
            "baselines": baselines(name, cli.datamodule), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": _doc.machine_line()}


def table(results: dict) -> str:
    rows = []
    for name, r in results.items():
        spec, s = RECIPES[name], r["study"]
        states = ", ".join(f"{n} {k.lower()}" for k, n in sorted(s["states"].items()))
        params = ", ".join(f"{k} {float(v):.3g}" for k, v in s["best_params"].items())
        base = ", ".join(f"{k} {v:.4f}" for k, v in r["baselines"].items())
        rows.append([f"`recipes/{name}.yaml`", f"{s['trials']} trials ({states})" + (f"; {r['budget']}" if r.get("budget") else ""),
                     f"`recipes/tune/{name}.space.yaml`: {params}", f"{spec['metric']} {s['best_value']:.4f}",
                     f"{spec['test_metric']} **{r['test']:.4f}**", base, f"{spec['old']:.4f} ({spec['old_note']})"])
    return _doc.md_table(["recipe", "budget", "space: best values", "best validation", "test, read once", "baselines (same test rows)",
                          "earlier test-selected recipe"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--test", nargs="+", choices=sorted(RECIPES), default=[], help="run mmte test once on these recipes' best trials")
    p.add_argument("--budget", nargs=2, action="append", default=[], metavar=("RECIPE", "TEXT"),
                   help="the per-trial budget of a recipe's study, as said in the table (e.g. '1 epoch per trial')")
    _doc.add_argument(p, "recipe-selection")
    args = p.parse_args(argv)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in args.test:
        if name in results:
            raise SystemExit(f"{name}: its test split was read already ({results[name]['date']}); the figure is in {RESULTS}")
        results[name] = {"study": study_summary(name), **test_once(name)}
        print(json.dumps({name: results[name]}), flush=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, text in args.budget:
        results[name]["budget"] = text
        RESULTS.write_text(json.dumps(results, indent=1))
    print(table(results))
    if args.update_doc:
        machine = "Machine (each test run's): " + "; ".join(f"{name}: {r['machine'].removeprefix('Machine: ').rstrip('.')}" for name, r in results.items()) + "."
        worse = [f"{name} ({RECIPES[name]['test_metric']} {r['test']:.4f} against {RECIPES[name]['old']:.4f})" for name, r in results.items()
                 if (r["test"] > RECIPES[name]["old"]) == RECIPES[name]["metric"].endswith(("mse", "mae", "loss"))]
        note = ("Each recipe's settings were searched by `mmte tune` on its validation split only (the study's command heads its space "
                "file), then its test split was read once, by `mmte test` on the best trial's checkpoint. The last column is the recipe as "
                "it was before, whose settings had been compared on the test split: a reference, not a result. "
                + (f"Below it: {', '.join(worse)}; the validation-selected recipe is shipped anyway, as it was chosen without the test split. "
                   if worse else "")
                + "`recipes/fsdd_speakers.yaml` is not re-selected: one leave-one-speaker-out fit takes about 8 minutes per fold on an idle "
                "machine (five folds a setting), more than a study on 2 shared cores holds; its comment says how its settings were chosen.")
        command = "; ".join([*(f"python bench/recipe_selection.py --test {name}" for name in results), "python bench/recipe_selection.py --update-doc"])
        _doc.update_doc("recipe-selection", table(results) + "\n\n" + note, command, args.update_doc, machine=machine,
                        title="Recipe selection on validation (`bench/recipe_selection.py`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
