"""Do the shipped recipes hold up on data they were not tuned on? Each recipe family against simple
baselines computed in the same run, on the same splits.

* **audio**: leave-one-speaker-out over the Free Spoken Digit Dataset's five speakers: train
  ``recipes/fsdd_speakers.yaml`` on four speakers, test on the fifth, every fold. Baselines on the same
  files: logistic regression on mean+std pooled log-mel fbank features, and a small CNN (three conv
  blocks) on the fbank.
* **forecast**: ETTh1 in the literature protocol (12/4/4 months, train-split z-score, input 96,
  stride-1 test windows; MSE/MAE on the standardised scale over all channels) with
  ``recipes/etth1_forecast.yaml`` for each horizon. Baselines on the same windows: repeat the last
  value, and a per-channel least-squares linear map from the 96 inputs to the horizon (closed form,
  fitted on the training windows), and, as the recipe takes a daily cycle out, the least squares with
  the same cycle ("linear + cycle").
* **tabular**: diamonds ``cut`` (5 classes) with ``recipes/diamonds_tabular.yaml``: a seeded stratified
  80/20 split (the recipe carves 10 % of all rows from the 80 % for early stopping). Baselines on the
  same rows: scikit-learn's HistGradientBoostingClassifier (native categorical support) and a
  one-hot + standardised logistic regression, both fitted on the 80 %.

mmte runs the way users run it: ``mmte fit`` through :class:`mmte.cli.MMTECLI` on the shipped recipe
(with the data path and split overrides a user would pass), then the trainer's ``test``. The audio
folds test the final model (validation clips come from the training speakers, so they cannot choose a
model for a new voice); forecast and tabular test the best-validation checkpoint.

::

    python bench/generalisation.py --jobs 2 --update-doc            # everything (about an hour on 2 idle cores)
    python bench/generalisation.py --families tabular                # one family (or audio,forecast)
    python bench/generalisation.py --families audio --fold theo      # one leave-one-speaker-out fold
    python bench/generalisation.py --families audio --folds 2 --epochs-scale 0.2   # a quick check
    python bench/generalisation.py --families audio --seeds 0 1 2 --jobs 2   # every fold at three seeds: per-seed and mean
    python bench/generalisation.py --families forecast --horizons 96 192 336 720
    python bench/generalisation.py --families forecast --mmte-args "--model.lr 3e-4"   # a recipe variant
    python bench/generalisation.py --merge a.json b.json --update-doc  # join runs made side by side
    python bench/generalisation.py --workdir W --resume ...            # a killed run, from its last checkpoints
    python bench/generalisation.py --smoke                            # the pipeline in about a minute

Prints a markdown table per family and the targets, writes JSON to ``bench/results/generalisation.json``
(``--out``; families not run keep their earlier entry, each with its own command, CPU flags and load).
``--update-doc`` writes each family's table into its own section of BENCHMARKS.md
(``generalisation-audio``, ``-forecast``, ``-tabular``), with the command and machine it was measured with.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import _doc

DATA = ROOT.parent / "shared" / "data"
TITLES = {"audio": "Generalisation: audio, leave one speaker out", "forecast": "Generalisation: forecasting, ETTh1",
          "tabular": "Generalisation: tabular, diamonds"}


# ------------------------------------------------------------------------------------------ running mmte
def mmte_fit(args: list[str], root: str):
    """``mmte fit <args>`` in this process; returns the finished CLI (trainer, model, datamodule). With
    ``--resume``, ``--ckpt_path last``: a run whose ``root`` holds ``checkpoints/last.ckpt`` (a killed bench)
    goes on from it, one without starts from scratch (mmte says which)."""
    from mmte.cli import MMTECLI

    resume = ["--ckpt_path", "last"] if RESUME else []
    argv, sys.argv = sys.argv, sys.argv[:1]  # the bench's own options are not the CLI's
    try:
        return MMTECLI(args=["fit", *args, *EXTRA, "--trainer.default_root_dir", root, "--trainer.enable_progress_bar", "false",
                             "--trainer.enable_model_summary", "false", *resume])
    finally:
        sys.argv = argv


SMOKE: list[str] = []  # --smoke: extra CLI arguments that make every run a few steps of a tiny model
EXTRA: list[str] = []  # --mmte-args: extra CLI arguments for every mmte run (variants of a recipe)
RESUME = False  # --resume: runs go on from their last checkpoint in --workdir


def _scaled_epochs(recipe: Path, scale: float) -> list[str]:
    import yaml

    epochs = int(yaml.safe_load(recipe.read_text())["trainer"]["max_epochs"])
    return ([] if scale == 1.0 else ["--trainer.max_epochs", str(max(1, round(epochs * scale)))]) + SMOKE


def _cpu() -> dict:
    from mmte.device import cpu_info

    cpu = cpu_info()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {"cpu": cpu.model, "flags": " ".join(f for f in _doc.MACHINE_FLAGS if f in cpu.flags), "cores": cpu.logical_cores,
            "load_at_start": round(load, 2), "torch": torch.__version__, "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------------ audio
def _fbank(path: str) -> torch.Tensor:
    from mmte.data.audio import compute_fbank, load_audio

    w, sr = load_audio(path)
    return compute_fbank(w, sr, 8000, 64, mean=None, std=None)  # raw log-mel [T, 64]


def pooled_logreg(train_fb, train_y, test_fb, test_y) -> float:
    """Logistic regression on per-mel-bin mean and std over the clip (standardised features)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def feats(fbs):
        return np.stack([torch.cat([f.mean(0), f.std(0)]).numpy() for f in fbs])

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000)).fit(feats(train_fb), train_y)
    return float(clf.score(feats(test_fb), test_y))


class SmallCNN(torch.nn.Module):
    """Three conv3x3-BN-ReLU-maxpool blocks (16/32/64 channels), global average pool, Linear."""

    def __init__(self, classes: int = 10):
        super().__init__()
        layers, c = [], 1
        for out in (16, 32, 64):
            layers += [torch.nn.Conv2d(c, out, 3, padding=1), torch.nn.BatchNorm2d(out), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
            c = out
        self.body, self.fc = torch.nn.Sequential(*layers), torch.nn.Linear(c, classes)

    def forward(self, x):  # [B, T, F]
        return self.fc(self.body(x[:, None]).mean((2, 3)))


def small_cnn(train_fb, train_y, test_fb, test_y, epochs: int, seed: int = 0) -> float:
    """The CNN on globally standardised log-mel fbanks padded/cropped to 100 frames; Adam, 32 a batch."""
    from mmte.data.audio import AUDIOSET_MEAN, AUDIOSET_STD

    def stack(fbs):
        out = torch.zeros(len(fbs), 100, fbs[0].shape[1])
        for i, f in enumerate(fbs):
            f = (f[:100] - AUDIOSET_MEAN) / (2 * AUDIOSET_STD)
            out[i, : f.shape[0]] = f
        return out

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = stack(train_fb), torch.tensor(train_y), stack(test_fb), torch.tensor(test_y)
    net = SmallCNN(int(max(train_y)) + 1)
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(xtr), generator=g).split(32):
            loss = torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        pred = torch.cat([net(b).argmax(-1) for b in xte.split(256)])
    return float((pred == yte).float().mean())


def audio_fold(args, work: str, spk: str, seed: int | None = None) -> dict:
    """One leave-one-speaker-out fold: ``mmte fit`` on the other speakers (at ``seed``: ``--seed_everything``;
    None: the recipe's), test on ``spk``; the baselines on the same training and test clips."""
    recipe = ROOT / "recipes" / "fsdd_speakers.yaml"
    rec = os.fspath(args.data / "fsdd" / "recordings")
    t0 = time.time()
    seeded = [] if seed is None else ["--seed_everything", str(seed)]
    root = os.path.join(work, "audio", spk, *([] if seed is None else [f"seed{seed}"]))
    cli = mmte_fit(["--config", os.fspath(recipe), "--data.init_args.data_dir", rec, "--data.init_args.test_groups", f"[{spk}]",
                    "--data.init_args.val_groups", "null", "--data.init_args.val_fraction", "0", "--trainer.limit_val_batches", "0",
                    *_scaled_epochs(recipe, args.epochs_scale), *seeded], root)
    res = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    fit_s = time.time() - t0
    dm = cli.datamodule
    paths = {s: dm.row_info[s]["path"] for s in ("train", "test")}
    labels = {s: [int(v) for v in dm.datasets[s].with_format(None)["label"]] for s in ("train", "test")}
    fb = {p: _fbank(p) for p in paths["train"] + paths["test"]}
    tr_fb, tr_y = [fb[p] for p in paths["train"]], labels["train"]
    te_fb, te_y = [fb[p] for p in paths["test"]], labels["test"]
    t1 = time.time()
    lr = pooled_logreg(tr_fb, tr_y, te_fb, te_y)
    cnn = small_cnn(tr_fb, tr_y, te_fb, te_y, epochs=max(1, round(15 * args.epochs_scale)))
    used_seed = cli.config["fit"].get("seed_everything") if seed is None else seed
    run = {"seed": used_seed if isinstance(used_seed, int) and not isinstance(used_seed, bool) else None, "mmte": float(res["test_acc"]),
           "epochs": cli.trainer.current_epoch, "fit_s": round(fit_s)}
    row = _fold_row(spk, [run], {"pooled_fbank_logreg": lr, "small_cnn": cnn, "train_clips": len(tr_y), "test_clips": len(te_y),
                                 "baselines_s": round(time.time() - t1)})
    print(json.dumps(row), flush=True)
    return row


def _runs(row: dict) -> list[dict]:
    """A fold row's per-seed runs (rows written before ``--seeds`` hold one run, seed unknown)."""
    if "runs" in row:
        return list(row["runs"])
    return [{"seed": row.get("seed"), "mmte": row["mmte"], "epochs": row.get("epochs"), "fit_s": row.get("fit_s")}]


def _fold_row(spk: str, runs: list[dict], base: dict) -> dict:
    """A fold's row: the baselines and its runs, ``mmte`` the mean over the runs (seeds)."""
    runs = sorted(runs, key=lambda r: (r["seed"] is None, r["seed"] if r["seed"] is not None else 0))
    keep = {k: base[k] for k in ("pooled_fbank_logreg", "small_cnn", "train_clips", "test_clips", "baselines_s") if k in base}
    return {"speaker": spk, "mmte": float(np.mean([r["mmte"] for r in runs])), **keep, "epochs": runs[0].get("epochs"),
            "fit_s": runs[0].get("fit_s"), "runs": runs}


def _join_rows(rows: list[dict]) -> list[dict]:
    """Rows of the same speaker (other seeds, or the same seed again: the later wins) -> one row per speaker."""
    by: dict[str, tuple[dict, dict]] = {}
    for r in rows:
        base, runs = by.get(r["speaker"], (r, {}))
        for run in _runs(r):
            runs[run["seed"]] = run
        by[r["speaker"]] = (base, runs)
    return [_fold_row(spk, list(runs.values()), base) for spk, (base, runs) in by.items()]


def _tag(spk: str, seed: int | None) -> str:
    """The name of a fold job's log and JSON files in the workdir."""
    return spk if seed is None else f"{spk}-seed{seed}"


def _fold_job(args, work: str, spk: str, seed: int | None = None) -> subprocess.Popen:
    """A fold (at one seed) in its own process (one torch thread), for ``--jobs`` > 1."""
    tag = _tag(spk, seed)
    cmd = [sys.executable, os.fspath(Path(__file__).resolve()), "--family", "audio", "--fold", spk, "--epochs-scale", str(args.epochs_scale),
           "--data", os.fspath(args.data), "--workdir", work, "--out", os.path.join(work, f"fold-{tag}.json"), "--mmte-args", args.mmte_args,
           *(["--seeds", str(seed)] if seed is not None else []), *(["--smoke"] if args.smoke else []), *(["--resume"] if args.resume else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MMTE_THREADS": "1"}
    with open(os.path.join(work, f"fold-{tag}.log"), "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _audio_summary(rows: list[dict]) -> dict:
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("mmte", "pooled_fbank_logreg", "small_cnn")}
    seeds = sorted({run["seed"] for r in rows for run in _runs(r) if run["seed"] is not None})
    per_seed = {str(s): float(np.mean([run["mmte"] for r in rows for run in _runs(r) if run["seed"] == s])) for s in seeds
                if all(any(run["seed"] == s for run in _runs(r)) for r in rows)}  # only seeds every fold ran
    return {"recipe": "recipes/fsdd_speakers.yaml", "folds": rows, "mean": mean, "mean_per_seed": per_seed,
            "above_baselines_every_fold": all(r["mmte"] > max(r["pooled_fbank_logreg"], r["small_cnn"]) for r in rows)}


def _merge_folds(a: dict, b: dict) -> dict:
    """Two audio results with folds (or seeds) run in separate processes -> one (a fold's seed in both: ``b``'s)."""
    rows = sorted(_join_rows([*a["folds"], *b["folds"]]), key=lambda r: r["speaker"])
    out = {**a, **_audio_summary(rows)}
    cmds = [c for c in (a.get("command"), b.get("command")) if c]
    out["command"] = " ; ".join(dict.fromkeys(" ; ".join(cmds).split(" ; ")))
    out["seconds"] = max(a.get("seconds", 0), b.get("seconds", 0))
    return out


def run_audio(args, work: str) -> dict:
    from mmte.training.data import FolderDataModule

    rec = os.fspath(args.data / "fsdd" / "recordings")
    speakers = FolderDataModule(data_dir=rec, pattern="*.wav", label_regex=r"^(\d+)_", group_regex=r"^\d+_([a-z]+)_", val_fraction=0.0).groups()
    if args.fold:
        unknown = sorted(set(args.fold) - set(speakers))
        if unknown:
            raise SystemExit(f"--fold {unknown}: not a speaker of {rec}; expected some of {speakers}")
        folds = [s for s in speakers if s in args.fold]
    else:
        folds = speakers[: args.folds] if args.folds else speakers
    seeds = args.seeds or [None]
    jobs = [(spk, seed) for spk in folds for seed in seeds]
    if args.jobs > 1 and len(jobs) > 1:
        os.makedirs(work, exist_ok=True)
        rows, pending = [], list(jobs)
        running: list[tuple[tuple[str, int | None], subprocess.Popen]] = []
        while pending or running:
            while pending and len(running) < args.jobs:
                job = pending.pop(0)
                running.append((job, _fold_job(args, work, *job)))
            job, proc = running.pop(0)
            tag = _tag(*job)
            if proc.wait() != 0:
                raise SystemExit(f"audio fold {tag} failed (exit {proc.returncode}); its log: {os.path.join(work, f'fold-{tag}.log')}")
            rows += json.loads(Path(work, f"fold-{tag}.json").read_text())["audio"]["folds"]
    else:
        rows = [audio_fold(args, work, spk, seed) for spk, seed in jobs]
    rows = sorted(_join_rows(rows), key=lambda r: folds.index(r["speaker"]))
    return _audio_summary(rows)


# --------------------------------------------------------------------------------------------- forecast
def _windows(dm, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A split's input and target windows, and the cycle's level over their steps when the data has one."""
    xs, ys, lv = [], [], []
    for b in dm.loader(split, False):
        ts = b["time_series"]
        if isinstance(ts, dict):  # a series with its cycle
            lv.append(ts["season"].numpy())
            ts = ts["series"]
        xs.append(ts.numpy())
        ys.append(b["target"].numpy())
    season = np.concatenate(lv).astype(np.float64) if lv else None
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64), season


def _least_squares(xtr, ytr, xte) -> np.ndarray:
    """A per-channel least-squares linear map (with bias) from each window's inputs to its horizon."""
    pred = np.zeros((len(xte), ytr.shape[1], ytr.shape[2]))
    for c in range(xtr.shape[2]):
        w, *_ = np.linalg.lstsq(np.c_[xtr[:, :, c], np.ones(len(xtr))], ytr[:, :, c], rcond=None)
        pred[:, :, c] = np.c_[xte[:, :, c], np.ones(len(xte))] @ w
    return pred


def _errors(pred, y) -> dict:
    return {"mse": float(((pred - y) ** 2).mean()), "mae": float(np.abs(pred - y).mean())}


def linear_baselines(dm) -> dict:
    """Repeat-last and least-squares linear on the data module's plain standardised windows; when the recipe
    has a seasonal cycle, also the least squares with the same cycle taken out of inputs and targets and added
    back to its forecasts ("linear + cycle": what the cycle alone gives a linear model)."""
    xtr, ytr, str_ = _windows(dm, "train")
    xte, yte, ste = _windows(dm, "test")
    out = {"repeat_last": _errors(np.repeat(xte[:, -1:], yte.shape[1], 1), yte), "linear": _errors(_least_squares(xtr, ytr, xte), yte),
           "train_windows": len(xtr), "test_windows": len(xte)}
    if str_ is not None:
        L = xtr.shape[1]
        pred = _least_squares(xtr - str_[:, :L], ytr - str_[:, L:], xte - ste[:, :L]) + ste[:, L:]
        out["linear_cycle"] = _errors(pred, yte)
        out["cycle"] = f"{dm.cycle['period']} rows"
    return out


def run_forecast(args, work: str) -> dict:
    recipe = ROOT / "recipes" / "etth1_forecast.yaml"
    csv = os.fspath(args.data / "ett" / "ETTh1.csv")
    rows = []
    for h in args.horizons:
        t0 = time.time()
        cli = mmte_fit(["--config", os.fspath(recipe), "--data.init_args.path", csv, "--data.init_args.horizon", str(h),
                        *_scaled_epochs(recipe, args.epochs_scale)], os.path.join(work, "forecast", str(h)))
        res = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)[0]
        fit_s = time.time() - t0
        base = linear_baselines(cli.datamodule)
        row = {"horizon": h, "mmte": {"mse": float(res["test_mse"]), "mae": float(res["test_mae"])}, **base,
               "epochs": cli.trainer.current_epoch, "fit_s": round(fit_s)}
        row["mse_vs_linear"] = row["mmte"]["mse"] / row["linear"]["mse"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return {"recipe": "recipes/etth1_forecast.yaml", "horizons": rows}


# ---------------------------------------------------------------------------------------------- tabular
def tabular_baselines(dm, path: str, label: str) -> dict:
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    df = pd.read_csv(path)
    assign = dm._assignment()
    fit_rows, test_rows = np.r_[assign["train"], assign["val"]], assign["test"]
    x, y = df.drop(columns=[label]), df[label].astype(str)
    cats = [c for c in x.columns if not pd.api.types.is_numeric_dtype(x[c])]
    nums = [c for c in x.columns if c not in cats]
    xc = x.copy()
    for c in cats:
        xc[c] = pd.Categorical(xc[c], categories=sorted(x[c].iloc[fit_rows].dropna().unique()))
    hgb = HistGradientBoostingClassifier(random_state=0, categorical_features="from_dtype").fit(xc.iloc[fit_rows], y.iloc[fit_rows])
    ct = ColumnTransformer([("c", OneHotEncoder(handle_unknown="ignore"), cats), ("n", StandardScaler(), nums)])
    lr = make_pipeline(ct, LogisticRegression(max_iter=3000)).fit(x.iloc[fit_rows], y.iloc[fit_rows])
    return {"hist_gradient_boosting": float(hgb.score(xc.iloc[test_rows], y.iloc[test_rows])),
            "logistic_regression": float(lr.score(x.iloc[test_rows], y.iloc[test_rows])),
            "fit_rows": len(fit_rows), "test_rows": len(test_rows)}


def run_tabular(args, work: str) -> dict:
    recipe = ROOT / "recipes" / "diamonds_tabular.yaml"
    path = os.fspath(args.data / "tabular" / "diamonds.csv")
    t0 = time.time()
    cli = mmte_fit(["--config", os.fspath(recipe), "--data.init_args.path", path, "--data.init_args.label_column", "cut",
                    "--data.init_args.test_fraction", "0.2", *_scaled_epochs(recipe, args.epochs_scale)], os.path.join(work, "tabular"))
    res = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False)[0]
    fit_s = time.time() - t0
    row = {"dataset": "diamonds/cut", "mmte": float(res["test_acc"]), **tabular_baselines(cli.datamodule, path, "cut"),
           "epochs": cli.trainer.current_epoch, "batch_size": cli.datamodule.batch_size, "fit_s": round(fit_s)}
    print(json.dumps(row), flush=True)
    return {"recipe": "recipes/diamonds_tabular.yaml", "rows": [row]}


# ---------------------------------------------------------------------------------------------- tables
def machine(r: dict) -> str:
    """The machine line of one family's run, from what the run stored (the run may come from another machine)."""
    e = r.get("env", {})
    smoke = " **--smoke: a pipeline check, figures meaningless.**" if r.get("smoke") else ""
    return (f"Machine: {e.get('cpu', '?')} (flags: {e.get('flags') or 'n/a'}), {e.get('cores', '?')} logical cores, torch {e.get('torch', '?')}, "
            f"{r.get('date', '?')}, load average {e.get('load_at_start', '?')} at the start, {r.get('seconds', '?')} s.{smoke}")


def goals(results: dict) -> dict[str, bool]:
    """The targets, checked on the figures."""
    out = {}
    if "audio" in results:
        a = results["audio"]
        out["audio: LOSO mean >= 0.90"] = a["mean"]["mmte"] >= 0.90
        out["audio: above both baselines on every fold"] = bool(a["above_baselines_every_fold"])
        out["audio: all five folds run"] = len(a["folds"]) == 5
    if "forecast" in results:
        r96 = [r for r in results["forecast"]["horizons"] if r["horizon"] == 96]
        if r96:
            out["forecast: ETTh1 MSE@96 <= 0.95 x linear"] = r96[0]["mse_vs_linear"] <= 0.95
            out["forecast: ETTh1 MSE@96 <= 0.370"] = r96[0]["mmte"]["mse"] <= 0.370
    if "tabular" in results:
        r = results["tabular"]["rows"][0]
        out["tabular: diamonds accuracy >= HistGradientBoosting"] = r["mmte"] >= r["hist_gradient_boosting"]
    return out


def _md_row(cells: list[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


HEADINGS = {"audio": "Audio: FSDD leave-one-speaker-out (`{recipe}`), test accuracy on the unheard speaker",
            "forecast": "Forecasting: ETTh1, input 96, stride-1 test windows (`{recipe}`), standardised scale",
            "tabular": "Tabular: diamonds `cut`, seeded stratified 80/20 split (`{recipe}`), test accuracy"}


def family_table(fam: str, res: dict) -> str:
    """One family's table and the notes that read it (no heading, command or machine)."""
    out = []
    if fam == "audio":
        a = res
        multi = any(len(_runs(r)) > 1 for r in a["folds"])
        seed_col = ["per seed"] if multi else []
        head = ["held-out speaker", "mmte" + (" (mean over seeds)" if multi else ""), *seed_col, "pooled-fbank logistic regression",
                "small CNN", "epochs", "fit s"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

        def seeds_cell(pairs):
            return [", ".join(f"{v:.3f} (seed {k})" for k, v in pairs)] if multi else []

        for r in a["folds"]:
            cells = [r["speaker"], f"{r['mmte']:.3f}", *seeds_cell([(run["seed"], run["mmte"]) for run in _runs(r)]),
                     f"{r['pooled_fbank_logreg']:.3f}", f"{r['small_cnn']:.3f}", str(r.get("epochs", "")), str(r.get("fit_s", ""))]
            out.append(_md_row(cells))
        m = a["mean"]
        cells = ["**mean**", f"**{m['mmte']:.3f}**", *seeds_cell(list(a.get("mean_per_seed", {}).items())), f"{m['pooled_fbank_logreg']:.3f}",
                 f"{m['small_cnn']:.3f}", "", ""]
        out += [_md_row(cells), "",
                f"mmte above both baselines on every fold: {'yes' if a['above_baselines_every_fold'] else 'no'}."]
    elif fam == "forecast":
        f = res
        out += [("| horizon | mmte MSE | mmte MAE | linear (LS) MSE | linear MAE | repeat-last MSE | repeat-last MAE | linear + cycle MSE "
                "| mmte / linear MSE | epochs |"), "|---|---|---|---|---|---|---|---|---|---|"]
        for r in f["horizons"]:
            lc = f"{r['linear_cycle']['mse']:.4f}" if "linear_cycle" in r else "-"
            out.append(f"| {r['horizon']} | {r['mmte']['mse']:.4f} | {r['mmte']['mae']:.4f} | {r['linear']['mse']:.4f} | {r['linear']['mae']:.4f} | "
                       f"{r['repeat_last']['mse']:.4f} | {r['repeat_last']['mae']:.4f} | {lc} | {r['mse_vs_linear']:.3f} | {r.get('epochs', '')} |")
        cyc = {r.get("cycle") for r in f["horizons"]} - {None}
        out += [*(["", (f"The recipe takes a seasonal cycle ({', '.join(sorted(cyc))}: each channel's mean per phase over the training "
                        "months) out of the model's inputs and adds it back to its forecasts. The linear and repeat-last baselines see the "
                        "plain windows; \"linear + cycle\" is the same least squares with the recipe's cycle. "
                        "All errors are on the plain standardised scale.")] if cyc else [])]
    else:
        t = res
        out += ["| data | mmte | HistGradientBoosting | logistic regression | epochs (early stopping) | batch size |", "|---|---|---|---|---|---|"]
        for r in t["rows"]:
            out.append(f"| {r['dataset']} | {r['mmte']:.4f} | {r['hist_gradient_boosting']:.4f} | {r['logistic_regression']:.4f} | {r['epochs']} | {r['batch_size']} |")
    g = {k.split(": ", 1)[1]: v for k, v in goals({fam: res}).items()}
    if g:
        out += ["", "Targets: " + "; ".join(f"{k}: {'met' if v else '**not met**'}" for k, v in g.items()) + "."]
    return "\n".join(out)


def markdown(results: dict) -> str:
    """Every family's heading, command, machine line and table, as printed."""
    out = []
    for fam, res in results.items():
        out += [f"### {HEADINGS[fam].format(recipe=res.get('recipe', '?'))}", "", f"`{res.get('command', '?')}`", "", machine(res), "",
                family_table(fam, res), ""]
    return "\n".join(out)


def update_doc(path: str | os.PathLike, results: dict) -> None:
    """Write each family's table into its own BENCHMARKS.md section (``generalisation-<family>``)."""
    for fam, res in results.items():
        body = f"{HEADINGS[fam].format(recipe=res.get('recipe', '?'))}.\n\n{family_table(fam, res)}"
        _doc.update_doc(f"generalisation-{fam}", body, res.get("command", "?"), path, machine=machine(res), title=TITLES[fam])


def _families(text: str) -> list[str]:
    fams = [f for f in text.replace(",", " ").split() if f]
    bad = [f for f in fams if f not in FAMILIES]
    if bad or not fams:
        raise argparse.ArgumentTypeError(f"unknown family {bad or text!r}; expected a comma-separated subset of {list(FAMILIES)}")
    return fams


FAMILIES = ("audio", "forecast", "tabular")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", "--family", dest="families", type=_families, nargs="+", action="extend", default=None,
                   help="comma-separated: audio,forecast,tabular (default: all three)")
    p.add_argument("--folds", type=int, default=0, help="audio: run only the first N speakers' folds (0: all five)")
    p.add_argument("--fold", nargs="+", default=None, help="audio: run only these speakers' folds")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="audio: run every fold at each of these seeds (--seed_everything); the table gives each seed and their mean "
                        "(default: the recipe's seed, one run a fold)")
    p.add_argument("--jobs", type=int, default=1, help="audio: folds (and seeds) run at once, each in its own process with one torch thread")
    p.add_argument("--horizons", type=int, nargs="+", default=[96], help="forecast horizons (literature: 96 192 336 720)")
    p.add_argument("--epochs-scale", type=float, default=1.0, help="multiply the recipes' max_epochs (0.2: a quick check)")
    p.add_argument("--data", type=Path, default=DATA, help="the shared data folder (fsdd/, ett/, tabular/)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "generalisation.json",
                   help="JSON results; families not run this time keep their earlier entry there (each with its own command)")
    p.add_argument("--fresh", action="store_true", help="drop the families not run this time from --out")
    p.add_argument("--merge", nargs="+", type=Path, default=None,
                   help="run nothing: merge the families of these results files (e.g. runs made side by side) into --out and print the tables")
    _doc.add_argument(p, "generalisation-<family>")
    p.add_argument("--workdir", default=None, help="where the runs' logs and checkpoints go (default: a temporary folder)")
    p.add_argument("--mmte-args", default="", help="extra `mmte fit` arguments for every run, e.g. \"--model.lr 3e-4\" (recipe variants)")
    p.add_argument("--resume", action="store_true",
                   help="go on from each run's checkpoints/last.ckpt under --workdir (a killed bench; same command otherwise)")
    p.add_argument("--smoke", action="store_true", help="a pipeline check: tiny backbone, 2 training batches, 1 epoch (figures meaningless)")
    args = p.parse_args(argv)
    families = list(dict.fromkeys([f for group in args.families or [FAMILIES] for f in group]))
    if args.smoke:
        SMOKE[:] = ["--config", os.fspath(ROOT / "configs" / "encoders" / "tiny.yaml"), "--trainer.max_epochs", "1",
                    "--trainer.limit_train_batches", "2"]
        args.epochs_scale = min(args.epochs_scale, 1 / 15)
    EXTRA[:] = shlex.split(args.mmte_args)
    if args.resume and not args.workdir:
        raise SystemExit("--resume needs --workdir: the folder the killed run wrote its checkpoints to")
    global RESUME
    RESUME = args.resume
    env = _cpu()
    work = args.workdir or tempfile.mkdtemp(prefix="mmte-generalisation-")
    argv_used = sys.argv[1:] if argv is None else argv
    command = _doc.command_line("bench/generalisation.py", argv_used)
    new: dict = {}
    if args.merge:
        for path in args.merge:
            for fam, res in json.loads(path.read_text()).items():
                if fam == "audio" and "audio" in new:  # folds run as separate processes: one table
                    new["audio"] = _merge_folds(new["audio"], res)
                elif fam in FAMILIES:
                    new[fam] = res
    else:
        runners = {"audio": run_audio, "forecast": run_forecast, "tabular": run_tabular}
        for fam in families:
            t0 = time.time()
            res = runners[fam](args, work)
            res.update(seconds=round(time.time() - t0), command=command.strip(), env=env, smoke=args.smoke,
                       date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            new[fam] = res
    results: dict = {}
    if not args.fresh and args.out.exists():  # read now, not at the start: runs side by side share one --out
        results = {k: v for k, v in json.loads(args.out.read_text()).items() if k in FAMILIES}
    results.update(new)
    results = {k: results[k] for k in FAMILIES if k in results}
    body = markdown(results)
    print(body)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    if args.update_doc:
        update_doc(args.update_doc, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
