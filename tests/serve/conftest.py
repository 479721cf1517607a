"""Trained checkpoints for the serving tests (a tiny quickstart and a tiny FSDD audio model) and ``mmte serve`` as a process."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mmte.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "recipes" / "quickstart.yaml"
FSDD = ROOT / "recipes" / "fsdd_audio.yaml"
TINY = ROOT / "configs" / "encoders" / "tiny.yaml"
RECORDINGS = ROOT.parent / "shared" / "data" / "fsdd" / "recordings"
FAST = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
FP32 = ["--trainer.precision", "32-true"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def predict(base: list[str], out: Path, *extra: str) -> list[dict[str, str]]:
    """``mmte predict`` on the run's best checkpoint -> its predictions.csv rows."""
    assert main(["predict", *base, *extra, "--ckpt_path", "best", "--prediction_writer.output", str(out), "--prediction_writer.print_rows", "0"]) == 0
    return read_rows(out)


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A quickstart run (tiny backbone, 4 steps, the recipe's precision): ``(root, recipe args)`` for predict / serve."""
    root = tmp_path_factory.mktemp("serve-quick") / "run"
    base = ["--config", str(QUICK), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST, "--model.predict_dtype", "fp32"]
    assert main(["fit", *base, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "1"]) == 0
    return root, base


@pytest.fixture(scope="session")
def fsdd_run(tmp_path_factory) -> tuple[Path, list[str], list[Path]]:
    """recipes/fsdd_audio.yaml on 40 FSDD clips (tiny backbone, 2 steps, fp32): ``(root, recipe args, held-out WAVs)``.

    The held-out WAVs (another speaker) differ in length, so a batch of them is padded by the collate.
    """
    if not RECORDINGS.is_dir():
        pytest.skip(f"the FSDD recordings are not at {RECORDINGS}")
    tmp = tmp_path_factory.mktemp("serve-fsdd")
    data, held = tmp / "wavs", tmp / "held"
    data.mkdir()
    held.mkdir()
    for d in range(10):
        for spk in ("george", "theo"):
            for i in (0, 5):
                (data / f"{d}_{spk}_{i}.wav").symlink_to(RECORDINGS / f"{d}_{spk}_{i}.wav")
        (held / f"{d}_jackson_{d}.wav").symlink_to(RECORDINGS / f"{d}_jackson_{d}.wav")
    root = tmp / "run"
    base = ["--config", str(FSDD), "--config", str(TINY), "--trainer.default_root_dir", str(root), *FAST, *FP32,
            "--data.init_args.data_dir", str(data), "--data.init_args.batch_size", "8", "--data.init_args.num_workers", "0"]
    assert main(["fit", *base, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]) == 0
    return root, base, sorted(held.iterdir())


@contextlib.contextmanager
def serving(base: list[str], log: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """``mmte serve <base> --ckpt_path best <extra>`` as a process, healthy; killed at exit if still running."""
    from mmte.serve.client import wait_healthy

    port = free_port()
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "mmte", "serve", *base, "--ckpt_path", "best", "--port", str(port), *extra],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent)
        try:
            try:
                wait_healthy(port, proc, timeout=300)
            except RuntimeError as e:
                pytest.fail(f"{e}: {log.read_text()[-3000:]}")
            yield proc, port
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=20)
            if os.name == "posix" and proc.returncode not in (0, 143):
                print(log.read_text()[-3000:])
