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

A study's per-trial budget (fewer windows, fewer epochs) is its compute limit, not a chosen setting, so
each recipe then trains at full length twice, A with the earlier recipe's values and B with the study's
(``mmte fit --trainer.default_root_dir <run>``), and the shipped recipe is the one of the two with the
better validation value; its test split is read once:

* ``--compare RECIPE RUN_A RUN_B``: each run's searched values (its ``logs/version_0/config.yaml``) and
  its best validation value (its ``logs/version_0/metrics.csv``), stored with the winner on validation (a tie
  keeps A, the earlier values).
* ``--test-shipped RECIPE``: after the recipe file holds the winner's values (checked), ``mmte test
  --config recipes/<recipe>.yaml --ckpt_path best`` on the winner's run, once (and, for a recipe with no
  ``--test`` of its study, the baselines on the same test rows).

Structural settings (the trunk's size, embeddings, patching, the audio stem, augmentation, EMA, betas, warmup),
which the earlier recipes had compared on the test split, have a second study per recipe, by the command at the top
of ``recipes/tune/<recipe>.structure.space.yaml`` (into ``runs/tune/<recipe>.structure/``). No trial of it is
tested. ``--structure`` makes ``--compare``, ``--length``, ``--budget`` and ``--test-shipped`` act on it: A is the
recipe as it is (the values the first study shipped), B the structural study's best trial, both at full length;
``--structure --test-shipped`` refuses when A won (the recipe is unchanged and its stored test figure stands).
``--remaining`` does the same for the third study, ``recipes/tune/<recipe>.remaining.space.yaml`` (the settings
the first two left as chosen on the test split: warmup, batch size, the cycle, the crop, ...).

``fsdd_speakers`` has no ``--test`` of its study's best trial: its test speaker (george, held out of the
study and of both full-length runs by ``--data.init_args.test_groups '[george]'``) is read once, by
``--test-shipped``, beside the baselines of bench/generalisation.py (the pooled-fbank logistic regression and
the small CNN) trained on the same three training speakers.

::

    python bench/recipe_selection.py --test etth1_forecast diamonds_tabular   # the one test figure each
    python bench/recipe_selection.py --compare etth1_forecast /tmp/e3/etth1_A /tmp/e3/etth1_B
    python bench/recipe_selection.py --test-shipped etth1_forecast
    python bench/recipe_selection.py --compare fsdd_speakers /tmp/fsdd/A /tmp/fsdd/B   # no --test: george is read once, next line
    python bench/recipe_selection.py --test-shipped fsdd_speakers
    python bench/recipe_selection.py --structure --compare diamonds_tabular /tmp/dia/A /tmp/struct/dia_B
    python bench/recipe_selection.py --structure --test-shipped diamonds_tabular   # only when B won
    python bench/recipe_selection.py --update-doc                              # the tables, from what is stored
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import yaml

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
    # train: jackson, nicolas, yweweler; validation: theo (the recipe's val_groups); test: george, held out of everything
    "fsdd_speakers": {
        "family": "audio", "metric": "val_acc", "test_metric": "test_acc",
        "test_flags": ["--data.init_args.data_dir", str(DATA / "fsdd" / "recordings"), "--data.init_args.test_groups", "[george]"],
        "old": 0.914, "old_note": ("george fold at seed 0, bench/generalisation.py, 2026-12-06: trained on the other four speakers (theo "
                                   "too, no validation speaker), so not this protocol; its settings compared on the leave-one-speaker-out "
                                   "test accuracy"),
    },
}


#: the studies of a recipe: "" its optimisation settings (lr, weight decay, dropout; ``<recipe>.space.yaml``),
#: "structure" its structural ones (sizes, embeddings, patching, stem, ...; ``<recipe>.structure.space.yaml``),
#: "remaining" the settings those two left (warmup, batch size, cycle, crop, ...; ``<recipe>.remaining.space.yaml``)
KINDS = ("", "structure", "remaining")


def _suffix(kind: str) -> str:
    return f".{kind}" if kind else ""


def tune_dir(name: str, kind: str = "") -> Path:
    return ROOT / "runs" / "tune" / f"{name}{_suffix(kind)}"


def space_file(name: str, kind: str = "") -> Path:
    return ROOT / "recipes" / "tune" / f"{name}{_suffix(kind)}.space.yaml"


def study_summary(name: str, kind: str = "") -> dict:
    """The study's trials by state, the best trial's number, value and values (from ``trials.csv``)."""
    rows = list(csv.DictReader((tune_dir(name, kind) / "trials.csv").read_text().splitlines()))
    spec = RECIPES[name]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    best = (min if spec["metric"].endswith(("mse", "loss", "mae")) else max)(done, key=lambda r: float(r["value"]))
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    return {"trials": len(rows), "states": states, "best_trial": int(best["number"]), "best_value": float(best["value"]),
            "best_params": {k[len("params_"):]: v for k, v in best.items() if k.startswith("params_")}}


def searched_names(name: str, kind: str = "") -> list[str]:
    """The dotted settings the recipe's search space covers (``model.lr``, ...)."""
    return list(yaml.safe_load(space_file(name, kind).read_text()))


def dotted(config: dict, key: str):
    """``config``'s value at a dotted ``key`` (``model.backbone.hidden_dropout``)."""
    for part in key.split("."):
        config = config[part]
    return config


def _parsed(value):
    """A value as the recipe parser reads it (trials.csv and the structural choices hold YAML text)."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def same(a, b) -> bool:
    """Whether two recipe values are the same (numbers compared as floats; a value written as a YAML string,
    as a structural choice is, compared parsed)."""
    a, b = (_parsed(v) for v in (a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    return a == b


def fmt(value) -> str:
    """A searched value for a table cell: numbers to 3 significant digits, mappings as ``key value`` pairs."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def best_validation(name: str, run: Path, kind: str = "") -> dict:
    """One full-length run: its searched values, its best validation value and where it was logged."""
    log = run / "logs" / "version_0"
    config = yaml.safe_load((log / "config.yaml").read_text())
    metric = RECIPES[name]["metric"]
    values = [float(r[metric]) for r in csv.DictReader((log / "metrics.csv").read_text().splitlines()) if r.get(metric)]
    if not values:
        raise SystemExit(f"{run}: no {metric} in {log / 'metrics.csv'}; expected a finished mmte fit of recipes/{name}.yaml")
    best = (min if metric.endswith(("mse", "loss", "mae")) else max)(values)
    return {"run": str(run), "params": {k: dotted(config, k) for k in searched_names(name, kind)}, "best_val": best,
            "validations": len(values), "max_epochs": dotted(config, "trainer.max_epochs")}


def compare(name: str, run_a: Path, run_b: Path, kind: str = "") -> dict:
    """A (the earlier recipe's values) against B (the study's), both at full length, on validation only; a tie
    keeps A (no validation evidence for a change)."""
    runs = {"A": best_validation(name, run_a, kind), "B": best_validation(name, run_b, kind)}
    if runs["A"]["best_val"] == runs["B"]["best_val"]:
        return {"runs": runs, "winner": "A", "tie": True}
    pick = min if RECIPES[name]["metric"].endswith(("mse", "loss", "mae")) else max
    return {"runs": runs, "winner": pick(runs, key=lambda k: runs[k]["best_val"])}


def test_shipped(name: str, full: dict, with_baselines: bool = False) -> dict:
    """``mmte test --config recipes/<name>.yaml --ckpt_path best`` on the validation winner's run, in this process
    (``with_baselines``: and the baselines on the same test rows, under ``baselines``)."""
    from mmte.cli import MMTECLI

    spec, winner = RECIPES[name], full["runs"][full["winner"]]
    recipe = ROOT / "recipes" / f"{name}.yaml"
    shipped = {k: dotted(yaml.safe_load(recipe.read_text()), k) for k in [*winner["params"], "trainer.max_epochs"]}
    if not all(same(shipped[k], v) for k, v in {**winner["params"], "trainer.max_epochs": winner["max_epochs"]}.items()):
        raise SystemExit(f"{recipe}: holds {shipped}; expected the validation winner's values {winner['params']} and max_epochs {winner['max_epochs']}")
    t0 = time.time()
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = MMTECLI(args=["test", "--config", str(recipe), *spec["test_flags"], "--trainer.default_root_dir", winner["run"],
                            "--ckpt_path", "best", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    finally:
        sys.argv = argv
    out = {"test": float(cli.trainer.callback_metrics[spec["test_metric"]]), "checkpoint": str(cli.trainer.ckpt_path),
           "test_s": round(time.time() - t0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if with_baselines:
        out["baselines"] = baselines(name, cli.datamodule)
    return {**out, "machine": _doc.machine_line()}


def baselines(name: str, dm) -> dict:
    """The simple baselines of bench/generalisation.py on the data module's test rows."""
    from bench import generalisation as g

    if RECIPES[name]["family"] == "audio":  # trained on the same training speakers' clips as the model
        dm.setup("fit")
        paths = {s: dm.row_info[s]["path"] for s in ("train", "test")}
        labels = {s: [int(v) for v in dm.datasets[s].with_format(None)["label"]] for s in ("train", "test")}
        fb = {s: [g._fbank(p) for p in paths[s]] for s in ("train", "test")}
        return {"pooled-fbank logistic regression": g.pooled_logreg(fb["train"], labels["train"], fb["test"], labels["test"]),
                "small CNN": g.small_cnn(fb["train"], labels["train"], fb["test"], labels["test"], epochs=15)}
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
        params = ", ".join(f"{k} {fmt(v)}" for k, v in s["best_params"].items())
        base = ", ".join(f"{k} {v:.4f}" for k, v in r.get("baselines", {}).items())
        test = (f"{spec['test_metric']} **{r['test']:.4f}**" if "test" in r
                else "not read: the test split is read once, by the shipped recipe (next table)")
        rows.append([f"`recipes/{name}.yaml`", f"{s['trials']} trials ({states})" + (f"; {r['budget']}" if r.get("budget") else ""),
                     f"`recipes/tune/{name}.space.yaml`: {params}", f"{spec['metric']} {s['best_value']:.4f}",
                     test, base, f"{spec['old']:.4f} ({spec['old_note']})"])
    return _doc.md_table(["recipe", "budget", "space: best values", "best validation", "test, read once", "baselines (same test rows)",
                          "earlier test-selected recipe"], rows)


def full_table(results: dict) -> str:
    """The full-length A/B comparison on validation and the shipped recipe's one test figure."""
    rows = []
    for name, r in results.items():
        full, spec = r.get("full_length"), RECIPES[name]
        if not full:
            continue
        cells = []
        for label in ("A", "B"):
            run = full["runs"][label]
            params = ", ".join(f"{k.removeprefix('model.')} {fmt(v)}" for k, v in run["params"].items())
            cells.append(f"{params}: {spec['metric']} {run['best_val']:.4f} (best of {run['validations']} validations)")
        test = f"{spec['test_metric']} **{full['test']:.4f}**" if "test" in full else "not read yet"
        winner = full["winner"] + (" (a tie keeps A)" if full.get("tie") else "")
        rows.append([f"`recipes/{name}.yaml`", full.get("length", ""), *cells, winner, test,
                     ", ".join(f"{k} {v:.4f}" for k, v in r.get("baselines", {}).items())])
    return _doc.md_table(["recipe", "full length (both runs)", "A: earlier recipe's values", "B: mmte tune's values",
                          "shipped (better validation)", "shipped, test read once", "baselines (same test rows)"], rows)


def structure_table(results: dict, kind: str = "structure") -> str:
    """The structural (or ``remaining``) studies: budget, best trial, the full-length A/B on validation, what ships and its
    test figure."""
    rows = []
    for name, r in results.items():
        st, spec = r.get(kind), RECIPES[name]
        if not st:
            continue
        s = st["study"]
        states = ", ".join(f"{n} {k.lower()}" for k, n in sorted(s["states"].items()))
        cells = [f"`recipes/{name}.yaml`", f"{s['trials']} trials ({states})" + (f"; {st['budget']}" if st.get("budget") else ""),
                 f"`recipes/tune/{name}.{kind}.space.yaml`: " + ", ".join(f"{k.removeprefix('model.')} {fmt(v)}" for k, v in s["best_params"].items())
                 + f": {spec['metric']} {s['best_value']:.4f}"]
        full = st.get("full_length")
        if st.get("best_is_recipe") and not full:
            stood = shipped_test(r, kind)
            rows.append(cells + ["not needed: the study's best trial is the recipe's own structure", "", "", "A (the recipe, unchanged)",
                                 "not read again" + (f"; its test figure stands ({spec['test_metric']} {stood:.4f})" if stood is not None else ""),
                                 ", ".join(f"{k} {v:.4f}" for k, v in r.get("baselines", {}).items())])
            continue
        if not full:
            rows.append(cells + ["not trained at full length yet", "", "", "", "not read", ""])
            continue
        cells.append(full.get("length", ""))
        for label in ("A", "B"):
            run = full["runs"][label]
            cells.append(f"{spec['metric']} {run['best_val']:.4f} (best of {run['validations']} validations; max_epochs {run['max_epochs']})")
        winner = full["winner"] + (" (a tie keeps A)" if full.get("tie") else "")
        if "test" in full:
            test = f"{spec['test_metric']} **{full['test']:.4f}**"
        elif full["winner"] == "A":
            stood = shipped_test(r, kind)
            test = "not read again: A is the recipe as it was" + (f"; its test figure stands ({spec['test_metric']} {stood:.4f})" if stood is not None else "")
        else:
            test = "not read yet"
        rows.append(cells + [winner, test, ", ".join(f"{k} {v:.4f}" for k, v in r.get("baselines", {}).items())])
    a_b = ["A: the recipe's structure", "B: the study's best"] if kind == "structure" else ["A: the recipe as it was", "B: the study's best or another length"]
    return _doc.md_table(["recipe", "study budget", "space: best trial, its validation", "full length (both runs)", *a_b,
                          "shipped (better validation)", "shipped, test read once", "baselines (same test rows)"], rows)


def shipped_test(r: dict, kind: str):
    """The test figure that stands for a recipe before the ``kind`` study: the latest study's before it that read one."""
    for earlier in reversed(KINDS[:KINDS.index(kind)]):
        full = r.get(earlier, {}).get("full_length", {}) if earlier else r.get("full_length", {})
        if "test" in full:
            return full["test"]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--test", nargs="+", choices=sorted(RECIPES), default=[], help="run mmte test once on these recipes' best trials")
    p.add_argument("--budget", nargs=2, action="append", default=[], metavar=("RECIPE", "TEXT"),
                   help="the per-trial budget of a recipe's study, as said in the table (e.g. '1 epoch per trial')")
    p.add_argument("--compare", nargs=3, metavar=("RECIPE", "RUN_A", "RUN_B"),
                   help="store the best validation value of two full-length runs (A: earlier values, B: the study's) and the winner")
    p.add_argument("--length", nargs=2, action="append", default=[], metavar=("RECIPE", "TEXT"),
                   help="the training length both full-length runs had, as said in the table")
    p.add_argument("--test-shipped", choices=sorted(RECIPES), help="run mmte test once on the shipped recipe (the validation winner's run)")
    p.add_argument("--best-is-recipe", choices=sorted(RECIPES),
                   help="with --structure: store that the structural study's best trial is the recipe's own structure (checked against "
                        "the recipe file), so no full-length comparison is needed and the recipe's test figure stands")
    p.add_argument("--structure", action="store_true",
                   help="--compare, --length, --budget and --test-shipped act on the recipe's structural study "
                        "(recipes/tune/<recipe>.structure.space.yaml, runs/tune/<recipe>.structure)")
    p.add_argument("--remaining", action="store_true",
                   help="as --structure, on the study of the settings the first two left (recipes/tune/<recipe>.remaining.space.yaml, "
                        "runs/tune/<recipe>.remaining)")
    _doc.add_argument(p, "recipe-selection")
    args = p.parse_args(argv)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.structure or args.remaining or args.best_is_recipe:
        return structure_main(args, results, "remaining" if args.remaining else "structure")
    if args.compare:
        name, run_a, run_b = args.compare
        results.setdefault(name, {"study": study_summary(name)})  # a study with no --test (fsdd_speakers)
        if "test" in results[name].get("full_length", {}):
            raise SystemExit(f"{name}: the shipped recipe's test split was read already; the comparison stays as stored in {RESULTS}")
        results[name]["full_length"] = compare(name, Path(run_a), Path(run_b))
        print(json.dumps({name: results[name]["full_length"]}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, text in args.length:
        results[name]["full_length"]["length"] = text
        RESULTS.write_text(json.dumps(results, indent=1))
    if args.test_shipped:
        full = results[args.test_shipped].get("full_length")
        if not full:
            raise SystemExit(f"{args.test_shipped}: no full-length comparison stored; expected --compare first")
        if "test" in full:
            raise SystemExit(f"{args.test_shipped}: the shipped recipe's test split was read already ({full['date']}); the figure is in {RESULTS}")
        full.update(test_shipped(args.test_shipped, full, with_baselines="baselines" not in results[args.test_shipped]))
        if "baselines" in full:  # the recipe's baselines on its test rows, as --test stores them
            results[args.test_shipped]["baselines"] = full.pop("baselines")
        print(json.dumps({args.test_shipped: full}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name in args.test:
        if name == "fsdd_speakers":
            raise SystemExit(f"{name}: its test speaker is read once, by --test-shipped, not on the study's best trial")
        if name in results:
            raise SystemExit(f"{name}: its test split was read already ({results[name].get('date', '')}); the figure is in {RESULTS}")
        results[name] = {"study": study_summary(name), **test_once(name)}
        print(json.dumps({name: results[name]}), flush=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, text in args.budget:
        results[name]["budget"] = text
        RESULTS.write_text(json.dumps(results, indent=1))
    write_doc(args, results)
    return 0


def structure_main(args, results: dict, kind: str = "structure") -> int:
    """--compare / --length / --budget / --test-shipped on the structural studies (``--structure``) or the remaining
    settings' (``--remaining``)."""
    if args.test:
        raise SystemExit("--structure: a structural study's trials are never tested; its winner is read once by --test-shipped")
    if args.compare:
        name, run_a, run_b = args.compare
        st = results.setdefault(name, {}).setdefault(kind, {})
        if "test" in st.get("full_length", {}):
            raise SystemExit(f"{name}: the shipped recipe's test split was read already; the structural comparison stays as stored in {RESULTS}")
        st["study"] = study_summary(name, kind)
        st["full_length"] = compare(name, Path(run_a), Path(run_b), kind)
        print(json.dumps({name: st}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    if args.best_is_recipe:
        name = args.best_is_recipe
        st = results.setdefault(name, {}).setdefault(kind, {})
        st["study"] = study_summary(name, kind)
        recipe = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
        differ = {k: v for k, v in st["study"]["best_params"].items() if not same(dotted(recipe, k), v)}
        if differ:
            raise SystemExit(f"{name}: the structural study's best trial differs from recipes/{name}.yaml in {differ}; "
                             "expected --structure --compare of the two at full length")
        st["best_is_recipe"] = True
        print(json.dumps({name: st}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, text in args.length:
        results[name][kind]["full_length"]["length"] = text
        RESULTS.write_text(json.dumps(results, indent=1))
    for name, text in args.budget:
        st = results.setdefault(name, {}).setdefault(kind, {})
        st.setdefault("study", study_summary(name, kind))
        st["budget"] = text
        RESULTS.write_text(json.dumps(results, indent=1))
    if args.test_shipped:
        name = args.test_shipped
        full = results[name].get(kind, {}).get("full_length")
        if not full:
            raise SystemExit(f"{name}: no structural full-length comparison stored; expected --structure --compare first")
        if "test" in full:
            raise SystemExit(f"{name}: the shipped recipe's test split was read already ({full['date']}); the figure is in {RESULTS}")
        if full["winner"] == "A":
            raise SystemExit(f"{name}: A (the recipe's own structure) won on validation; the recipe is unchanged and its stored test figure stands")
        full.update(test_shipped(name, full, with_baselines="baselines" not in results[name]))
        if "baselines" in full:
            results[name]["baselines"] = full.pop("baselines")
        print(json.dumps({name: full}), flush=True)
        RESULTS.write_text(json.dumps(results, indent=1))
    write_doc(args, results)
    return 0


def write_doc(args, results: dict) -> None:
    """Print the tables; with --update-doc, write them into BENCHMARKS.md's recipe-selection section."""
    full = full_table(results)
    structure = structure_table(results)
    remaining = structure_table(results, "remaining")
    print(table(results) + "\n\n" + full + "\n\n" + structure + "\n\n" + remaining)
    if args.update_doc:
        machines = [f"{name} (study's best trial): {r['machine'].removeprefix('Machine: ').rstrip('.')}" for name, r in results.items() if "machine" in r]
        machines += [f"{name} (shipped recipe): {r['full_length']['machine'].removeprefix('Machine: ').rstrip('.')}"
                     for name, r in results.items() if "test" in r.get("full_length", {})]
        machines += [f"{name} (shipped recipe, structure re-selected): {r['structure']['full_length']['machine'].removeprefix('Machine: ').rstrip('.')}"
                     for name, r in results.items() if "test" in r.get("structure", {}).get("full_length", {})]
        machines += [f"{name} (shipped recipe, remaining settings re-selected): {r['remaining']['full_length']['machine'].removeprefix('Machine: ').rstrip('.')}"
                     for name, r in results.items() if "test" in r.get("remaining", {}).get("full_length", {})]
        machine = "Machine (each test run's): " + "; ".join(machines) + "."
        note = ("Studies: each recipe's searched settings by `mmte tune` on its validation split only (the study's command heads its "
                "space file) under the per-trial budget in the table, the budget a compute limit of 2 shared cores and not a chosen "
                "setting; the test figure there, where there is one, is the best trial's checkpoint, read once. The last column is the "
                "recipe as it was before, whose settings had been compared on the test split: a reference, not a result.")
        if full.count("\n") > 1:
            note += ("\n\nFull length, chosen on validation: each recipe trained at its full length twice, A with the earlier recipe's "
                     "searched values and B with the study's, compared on the best validation value of each run (the best in its "
                     "metrics.csv, the value its `best.ckpt` was picked by); the recipe ships the winner's values and that length, and its test split was "
                     "read once, by `mmte test --config recipes/<recipe>.yaml --ckpt_path best` on the winner's run.")
            if any(not r.get("full_length") for r in results.values()):
                note += (" A recipe missing from this table ships its study's best values at its own full training length (early stopping "
                         "on validation); its only test figure so far is the study's best trial's, at the study's budget.")
        if "fsdd_speakers" in results:
            note += ("\n\n`recipes/fsdd_speakers.yaml`: training speakers jackson, nicolas and yweweler, validation speaker theo (the "
                     "recipe's `val_groups`, val_acc); george is held out of the study and of both full-length runs "
                     "(`--data.init_args.test_groups '[george]'`) and read once, by the shipped recipe; the study's best trial was not "
                     "tested. Its baselines train on the same three speakers. The earlier figure trained on four speakers (theo too) "
                     "with no validation speaker: a different protocol, shown for reference.")
        else:
            note += ("\n\n`recipes/fsdd_speakers.yaml` is not re-selected: one leave-one-speaker-out fit takes about 8 minutes per fold on "
                     "an idle machine (five folds a setting), more than a study on 2 shared cores holds; its comment says how its settings "
                     "were chosen.")
        commands = [f"python bench/recipe_selection.py --test {name}" for name, r in results.items() if "test" in r]
        for name, r in results.items():
            f = r.get("full_length")
            if f:
                commands.append(f"python bench/recipe_selection.py --compare {name} {f['runs']['A']['run']} {f['runs']['B']['run']}")
                if "test" in f:
                    commands.append(f"python bench/recipe_selection.py --test-shipped {name}")
        for kind in ("structure", "remaining"):
            for name, r in results.items():
                if r.get(kind, {}).get("best_is_recipe"):
                    commands.append(f"python bench/recipe_selection.py --{kind} --best-is-recipe {name}")
                f = r.get(kind, {}).get("full_length")
                if f:
                    commands.append(f"python bench/recipe_selection.py --{kind} --compare {name} {f['runs']['A']['run']} {f['runs']['B']['run']}")
                    if "test" in f:
                        commands.append(f"python bench/recipe_selection.py --{kind} --test-shipped {name}")
        commands.append("python bench/recipe_selection.py --update-doc")
        body = "Studies:\n\n" + table(results) + ("\n\nFull length, chosen on validation:\n\n" + full if full.count("\n") > 1 else "")
        if structure.count("\n") > 1:
            body += "\n\nStructural settings, chosen on validation:\n\n" + structure
            note += ("\n\nStructural settings (the trunk's size, embeddings, patching, stem, augmentation, EMA, betas, warmup, ...), "
                     "which the earlier recipes had compared on the test split: a second study per recipe by `mmte tune` on validation "
                     "only (the command heads `recipes/tune/<recipe>.structure.space.yaml`; its per-trial budget a compute limit), no "
                     "trial tested; then the recipe as it was (A, the values the tables above ship) and the study's best trial (B) "
                     "trained at the recipe's full length and were compared on their best validation value. B ships only when it is "
                     "better (a tie keeps A), and only then is the test split read again, once, on B's run. Settings a structural "
                     "study did not cover: the remaining settings (below, where run) and each recipe's comment.")
            if "structure" in results.get("fsdd_speakers", {}):
                note += (" `recipes/fsdd_speakers.yaml`'s structural study and full-length runs validate on the speaker nicolas "
                         "(theo, the recipe's validation speaker, scored 0.996 for both candidates of the first study) and train "
                         "on jackson, theo and yweweler, george held out; its A/B there compares the number of epochs (30, the "
                         "recipe's, against 15) with the study's best structure, which was the recipe's own. Its george figure "
                         "therefore comes from a model trained on other speakers than the first table's (jackson, nicolas, "
                         "yweweler), as do the baselines beside it: not the same protocol.")
        if remaining.count("\n") > 1:
            body += "\n\nRemaining settings, chosen on validation:\n\n" + remaining
            note += ("\n\nRemaining settings (warmup, batch size, the periodic embedding's frequencies, the cycle, the crop, the "
                     "trunk's adaptation, ...), which the first two studies had left as chosen on the test split: a third study per "
                     "recipe on validation only (the command heads `recipes/tune/<recipe>.remaining.space.yaml`; its per-trial budget "
                     "a compute limit), no trial tested, then the same full-length A/B on validation where the study's best differs "
                     "from the recipe (a tie keeps A; the test split is read again, once, only when B wins). Not in this table, in each "
                     "recipe's comment and `docs/experiments/2026-12-07-remaining-settings.md`: settings a short trial cannot rank, "
                     "compared at full length instead (`etth1_forecast`'s epochs: its row's B is the best of 2, 6 and 8 epochs "
                     "against the recipe's 4, the study's best being the recipe's own cycle and batch size; `fsdd_speakers`' "
                     "pretrained trunk against a small trunk from scratch), or checked rather than selected (`diamonds_tabular`'s "
                     "early-stopping patience, against its full-length validation curves); and settings that are not choices "
                     "(`etth1_forecast`'s input_len and horizon 96, the benchmark's protocol; max_patches, a bound that does not "
                     "change training).")
        _doc.update_doc("recipe-selection", body + "\n\n" + note, "; ".join(commands), args.update_doc, machine=machine,
                        title="Recipe selection on validation (`bench/recipe_selection.py`)")


if __name__ == "__main__":
    sys.exit(main())
