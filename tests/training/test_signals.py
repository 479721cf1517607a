"""SIGTERM / SIGINT really sent to a ``python -m mmte fit`` subprocess: it saves ``last.ckpt`` at the next step
boundary and exits 143 / 130, and ``--ckpt_path last`` finishes with the same weights and metrics as an
uninterrupted run (fp32, same seed: within 1e-6), mid-epoch (the data loader's position and the random
generators are restored; the head's dropout makes the generators matter) and at an epoch's end.

A marker callback prints ``MMTE-TEST step N`` at global step N and waits until the signal has arrived, so the
step at which the run stops is exact, not a race. (SIGKILL: tests/cli/test_verbs.py.)"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(ROOT / "configs" / "encoders" / "tiny.yaml"),
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", "--trainer.max_epochs", "2",
        "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2", "--data.init_args.batch_size", "16",
        "--model.heads", "{digit: {name: classification, pool: mean, hidden: 32, dropout: 0.3}}"]


def _last_metrics(root: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for f in sorted(root.glob("logs/version_*/metrics.csv")):
        with open(f) as fh:
            for r in csv.DictReader(fh):
                out.update({k: float(v) for k, v in r.items() if v not in ("", None)})
    return out


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _fit(env, root: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mmte", "fit", *ARGS, "--trainer.default_root_dir", str(root), *extra]
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory):
    """The uninterrupted run's folder for a list of extra arguments (each run once per module)."""
    runs: dict[tuple[str, ...], Path] = {}

    def get(*extra: str) -> Path:
        if extra not in runs:
            root = tmp_path_factory.mktemp("a") / "run"
            p = _fit(env, root, *extra)
            assert p.returncode == 0, p.stderr[-2000:]
            runs[extra] = root
        return runs[extra]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("sig,step,code,extra", [(signal.SIGTERM, 2, 143, ()), (signal.SIGINT, 4, 130, ("--model.ema_decay", "0.9"))],
                         ids=["sigterm-mid-epoch", "sigint-epoch-end-ema"])
def test_signal_saves_and_resume_matches_uninterrupted(env, uninterrupted, tmp_path, sig, step, code, extra):
    """SIGTERM mid-epoch (step 2 of 4) and SIGINT at an epoch's last step, the latter with ``ema_decay``: the
    checkpoint written at the signal holds the average of all ``step`` updates (the average is updated by the
    optimizer step, before the callbacks that save see the step) and the resumed run ends with the same
    averaged and live weights."""
    uninterrupted = uninterrupted(*extra)
    root = tmp_path / "run"
    cmd = [sys.executable, "-m", "mmte", "fit", *ARGS, *extra, "--trainer.default_root_dir", str(root), "--trainer.callbacks+=tests.training.callbacks.SignalAt",
           "--trainer.callbacks.step", str(step)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if line.startswith(f"MMTE-TEST step {step}"):
                p.send_signal(sig)
                break
        _, err = p.communicate(timeout=600)
    finally:
        p.kill()
    ck = root / "checkpoints"
    name = signal.Signals(sig).name
    assert p.returncode == code, err[-3000:]
    assert err.strip().splitlines()[-1] == f"mmte: stopped by {name} at step {step} (epoch 0); saved {ck}/last.ckpt; resume with --ckpt_path last"
    assert "Traceback" not in err and not list(ck.glob(".tmp-*"))
    saved = torch.load(ck / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == step
    # mid-epoch (step 2 of 4) the loader's position and the RNG travel with the checkpoint; at the epoch's last
    # batch the run first finishes the epoch (validation, epoch checkpoint) and then stops
    loader = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (loader["epoch"], loader["batches"]) == ((0, 2) if step == 2 else (1, 0))
    assert saved["mmte_resume"]["mid_epoch"] is (step == 2)
    if extra:
        assert saved["mmte"]["ema"] == {"decay": 0.9, "updates": step}

    resumed = _fit(env, root, *extra, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = torch.load(uninterrupted / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(ck / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 8
    for part in ("state_dict", "current_model_state") if extra else ("state_dict",):
        assert set(a[part]) == set(b[part])
        diff = max((a[part][k].double() - b[part][k].double()).abs().max().item() for k in a[part])
        assert diff <= 1e-6, (part, diff)
    ma, mb = _last_metrics(uninterrupted), _last_metrics(root)
    assert ma["epoch"] == mb["epoch"] == 1
    for k in ("val_loss", "val_acc", "train_loss_epoch"):
        assert abs(ma[k] - mb[k]) <= 1e-6, (k, ma[k], mb[k])
