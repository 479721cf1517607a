"""bench/generalisation.py's bookkeeping: the least-squares baseline against numpy's solver on a known
linear series, audio folds run as separate processes joined into one table, the issue's targets, and the
BENCHMARKS.md sections replaced in place (no training: the bench's runs are checked by its --smoke)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def bench():
    from tests.conftest import load_bench

    return load_bench("generalisation")


class _Windows:
    """A stand-in forecast data module: ``loader(split, train)`` yields window batches."""

    def __init__(self, x: np.ndarray, y: np.ndarray, xt: np.ndarray, yt: np.ndarray):
        self.split = {"train": (x, y), "test": (xt, yt)}

    def loader(self, split, train):
        x, y = self.split[split]
        for i in range(0, len(x), 7):
            yield {"time_series": torch.from_numpy(x[i : i + 7]), "target": torch.from_numpy(y[i : i + 7])}


def test_linear_baseline_recovers_a_linear_map(bench):
    rng = np.random.default_rng(0)
    x, xt = rng.normal(size=(40, 5, 2)), rng.normal(size=(9, 5, 2))
    w = rng.normal(size=(5, 3))
    y, yt = np.einsum("blc,lh->bhc", x, w) + 0.5, np.einsum("blc,lh->bhc", xt, w) + 0.5
    out = bench.linear_baselines(_Windows(x, y, xt, yt))
    assert out["linear"]["mse"] < 1e-20 and out["train_windows"] == 40 and out["test_windows"] == 9
    rl = np.repeat(xt[:, -1:], 3, 1)
    assert out["repeat_last"]["mse"] == pytest.approx(float(((rl - yt) ** 2).mean()), rel=1e-12)
    assert out["repeat_last"]["mae"] == pytest.approx(float(np.abs(rl - yt).mean()), rel=1e-12)


def test_linear_baseline_with_the_recipes_cycle(bench, tmp_path):
    """The issue's linear baseline is fitted on the plain standardised windows even when the recipe's data
    has a daily cycle; the least squares with the cycle taken out and added back is reported beside it and
    checked against numpy on the naive deseasonalised series."""
    import pandas as pd

    from mmte.training.data import ForecastDataModule

    rng = np.random.default_rng(1)
    t = pd.date_range("2020-01-01", periods=600, freq="h")
    hour = t.hour.to_numpy()
    daily = np.sin(2 * np.pi * hour / 24)
    df = pd.DataFrame({"date": t.astype(str), "a": 2 * daily + rng.normal(0, 0.2, 600),
                       "b": rng.normal(0, 1, 600).cumsum() * 0.1 - daily})
    df.to_csv(tmp_path / "s.csv", index=False)
    kw = {"input_len": 24, "horizon": 12, "time_column": "date", "batch_size": 32}
    cyc, plain = ForecastDataModule(str(tmp_path / "s.csv"), cycle="1D", **kw), ForecastDataModule(str(tmp_path / "s.csv"), **kw)
    for dm in (cyc, plain):
        dm.setup()
    got, want = bench.linear_baselines(cyc), bench.linear_baselines(plain)
    assert got["linear"] == want["linear"] and got["repeat_last"] == want["repeat_last"] and "linear_cycle" not in want
    # reference: numpy least squares on the series less each hour's mean
    vals = df[["a", "b"]].to_numpy(np.float64)
    tr = slice(0, 420)  # fractions 0.7 / 0.1 / 0.2 of 600 rows
    z = (vals - vals[tr].mean(0)) / vals[tr].std(0)
    lv = np.stack([z[tr][hour[tr] == h].mean(0) for h in range(24)])
    d = z - lv[hour]

    def win(a, lo, hi):
        s = np.arange(lo, hi - 36 + 1)[:, None] + np.arange(36)
        return a[s][:, :24], a[s][:, 24:], s[:, 24:]

    xtr, ytr, _ = win(d, 0, 420)
    xte, _, rows = win(d, 480 - 24, 600)
    pred = bench._least_squares(xtr, ytr, xte) + lv[hour[rows]]
    ref = float(((pred - win(z, 480 - 24, 600)[1]) ** 2).mean())
    assert got["cycle"] == "24 rows" and got["linear_cycle"]["mse"] == pytest.approx(ref, rel=1e-4)
    assert got["linear_cycle"]["mse"] < 0.9 * got["linear"]["mse"]
    row = {"horizon": 12, "mmte": {"mse": 0.1, "mae": 0.2}, **got, "mse_vs_linear": 0.1 / got["linear"]["mse"]}
    md = bench.markdown({"forecast": {"recipe": "r", "horizons": [row]}})
    assert f"| {got['linear_cycle']['mse']:.4f} |" in md and "takes a seasonal cycle (24 rows" in md


def _fold(spk: str, acc: float, lr: float, cnn: float) -> dict:
    return {"speaker": spk, "mmte": acc, "pooled_fbank_logreg": lr, "small_cnn": cnn}


def test_folds_from_separate_processes_join_into_one_table(bench, tmp_path):
    accs = {"george": (0.78, 0.441, 0.261), "jackson": (0.84, 0.51, 0.42), "theo": (0.89, 0.63, 0.49), "yweweler": (0.73, 0.75, 0.38)}
    files = []
    for i, (spk, (a, lr, cnn)) in enumerate(accs.items()):
        p = tmp_path / f"fold-{spk}.json"
        p.write_text(json.dumps({"audio": {"folds": [_fold(spk, a, lr, cnn)], "command": f"run {spk}", "seconds": 10 + i}}))
        files.append(str(p))
    fc = tmp_path / "forecast.json"
    fc.write_text(json.dumps({"forecast": {"recipe": "r", "horizons": [{"horizon": 96, "mmte": {"mse": 0.376, "mae": 0.397}, "linear": {"mse": 0.3815, "mae": 0.39},
                                                                        "repeat_last": {"mse": 1.29, "mae": 0.71}, "mse_vs_linear": 0.376 / 0.3815}]}}))
    out, md = tmp_path / "all.json", tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert bench.main(["--merge", *files, str(fc), "--out", str(out), "--update-doc", str(md)]) == 0
    res = json.loads(out.read_text())
    a = res["audio"]
    assert [r["speaker"] for r in a["folds"]] == sorted(accs)
    assert a["mean"]["mmte"] == pytest.approx(np.mean([v[0] for v in accs.values()]))
    assert a["mean"]["pooled_fbank_logreg"] == pytest.approx(np.mean([v[1] for v in accs.values()]))
    assert a["above_baselines_every_fold"] is False  # yweweler: 0.73 < 0.75
    assert a["command"] == "run george ; run jackson ; run theo ; run yweweler" and a["seconds"] == 13
    assert bench.goals(res) == {"audio: LOSO mean >= 0.90": False, "audio: above both baselines on every fold": False,
                                "audio: all five folds run": False, "forecast: ETTh1 MSE@96 <= 0.95 x linear": False,
                                "forecast: ETTh1 MSE@96 <= 0.370": False}
    text = md.read_text()
    assert "| **mean** | **0.810** | 0.583 | 0.388 | | |" in text and "## Other\n\nkept\n" in text
    # a second write replaces the section between its markers; what follows the section stays
    md.write_text(text + "notes after the section\n")
    assert bench.main(["--merge", str(fc), "--out", str(out), "--update-doc", str(md)]) == 0
    again = md.read_text()
    for fam in ("audio", "forecast"):
        assert again.count(f"<!-- bench:generalisation-{fam} -->") == 1 and again.count(f"<!-- /bench:generalisation-{fam} -->") == 1
    assert again.count("## Generalisation") == 2 and again.endswith("notes after the section\n")
    assert "`run george ; run jackson ; run theo ; run yweweler`" in again
    assert "| 96 | 0.3760 | 0.3970 | 0.3815 |" in again and "| **mean** | **0.810**" in again  # the audio entry kept in --out


def test_families_option_names_the_bad_value(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--families", "audio,vision"])
    assert "unknown family ['vision']; expected a comma-separated subset of ['audio', 'forecast', 'tabular']" in capsys.readouterr().err


def test_resume_goes_on_from_the_last_checkpoint(bench, tmp_path, monkeypatch):
    """--resume hands each run mmte's own ``--ckpt_path last`` (resolved under the run's root; a run with no
    checkpoint yet starts from scratch: tests/cli/test_verbs.py checks both)."""
    import mmte.cli

    seen = []
    monkeypatch.setattr(mmte.cli, "MMTECLI", lambda args: seen.append(args) or args)
    root = str(tmp_path / "audio" / "george")
    monkeypatch.setattr(bench, "RESUME", True)
    bench.mmte_fit(["--config", "r.yaml"], root)
    assert seen[-1][:3] == ["fit", "--config", "r.yaml"] and seen[-1][-2:] == ["--ckpt_path", "last"]
    assert seen[-1][seen[-1].index("--trainer.default_root_dir") + 1] == root
    monkeypatch.setattr(bench, "RESUME", False)
    bench.mmte_fit(["--config", "r.yaml"], root)  # without --resume a run starts afresh
    assert "--ckpt_path" not in seen[-1]
    with pytest.raises(SystemExit, match="--resume needs --workdir"):
        bench.main(["--families", "tabular", "--resume"])
    assert bench.RESUME is False  # refused before any state is set


def _seed_row(spk: str, seed, acc: float) -> dict:
    return {"speaker": spk, "mmte": acc, "pooled_fbank_logreg": 0.5, "small_cnn": 0.4, "epochs": 30, "fit_s": 800,
            "runs": [{"seed": seed, "mmte": acc, "epochs": 30, "fit_s": 800}]}


def test_seeds_run_every_fold_and_join_into_a_mean_per_fold_and_per_seed(bench, tmp_path, monkeypatch):
    """--seeds: each fold at each seed (the seed reaches mmte as --seed_everything), one row a fold with the
    runs' mean; separate seed runs merge (the same fold and seed again: the later wins); old single-run rows join."""
    calls = []
    accs = {("george", 0): 0.856, ("george", 1): 0.730, ("jackson", 0): 0.834, ("jackson", 1): 0.826}

    def fake_fold(args, work, spk, seed=None):
        calls.append((spk, seed))
        return _seed_row(spk, seed, accs[spk, seed])

    monkeypatch.setattr(bench, "audio_fold", fake_fold)
    out = tmp_path / "a.json"
    assert bench.main(["--family", "audio", "--fold", "george", "jackson", "--seeds", "0", "1", "--out", str(out), "--workdir", str(tmp_path)]) == 0
    assert calls == [("george", 0), ("george", 1), ("jackson", 0), ("jackson", 1)]
    a = json.loads(out.read_text())["audio"]
    assert [r["speaker"] for r in a["folds"]] == ["george", "jackson"]
    assert a["folds"][0]["mmte"] == pytest.approx(0.793) and [r["seed"] for r in a["folds"][0]["runs"]] == [0, 1]
    assert a["mean"]["mmte"] == pytest.approx((0.856 + 0.730 + 0.834 + 0.826) / 4)
    assert a["mean_per_seed"] == pytest.approx({"0": 0.845, "1": 0.778})
    md = bench.markdown({"audio": a})
    assert "| george | 0.793 | 0.856 (seed 0), 0.730 (seed 1) | 0.500 | 0.400 | 30 | 800 |" in md
    assert "| **mean** | **0.811** | 0.845 (seed 0), 0.778 (seed 1) | 0.500 | 0.400 | | |" in md
    # a third seed run later on its own, george again at seed 1 (replaces), and an old row without runs
    extra = tmp_path / "b.json"
    extra.write_text(json.dumps({"audio": {"folds": [_seed_row("george", 2, 0.9), _seed_row("george", 1, 0.75),
                                                     {"speaker": "theo", "mmte": 0.94, "pooled_fbank_logreg": 0.63, "small_cnn": 0.49}]}}))
    merged = tmp_path / "m.json"
    assert bench.main(["--merge", str(out), str(extra), "--out", str(merged)]) == 0
    m = json.loads(merged.read_text())["audio"]
    g = next(r for r in m["folds"] if r["speaker"] == "george")
    assert [(r["seed"], r["mmte"]) for r in g["runs"]] == [(0, 0.856), (1, 0.75), (2, 0.9)] and g["mmte"] == pytest.approx((0.856 + 0.75 + 0.9) / 3)
    assert [r["speaker"] for r in m["folds"]] == ["george", "jackson", "theo"]
    assert m["mean_per_seed"] == {}  # no seed was run on every fold (theo's seed is unknown)
