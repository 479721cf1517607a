"""`mmte` sets torch's intra-op threads: physical cores // local ranks by default, --threads /
MMTE_THREADS / OMP_NUM_THREADS override, and the choice is logged in the run's header."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from mmte.training import threads as th

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def keep_threads(monkeypatch):
    for var in ("MMTE_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="lscpu not available")
def test_physical_cores_match_lscpu():
    """Independent count: lscpu's (core, socket) pairs of the CPUs this process may use."""
    out = subprocess.run(["lscpu", "-p=cpu,core,socket"], capture_output=True, text=True, check=True).stdout
    allowed = os.sched_getaffinity(0)
    pairs = {tuple(ln.split(",")[1:]) for ln in out.splitlines() if ln and not ln.startswith("#") and int(ln.split(",")[0]) in allowed}
    assert th.physical_cores() == len(pairs)


def test_precedence(keep_threads, monkeypatch):
    cores = th.physical_cores()
    assert th.choose_threads(None, 1) == (cores, f"{cores} physical core{'s' * (cores != 1)} / 1 local rank")
    assert th.choose_threads(None, 4 * cores)[0] == 1  # at least one
    assert th.choose_threads(None, 2)[0] == max(1, cores // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert th.choose_threads(None, 1) == (3, "OMP_NUM_THREADS")
    monkeypatch.setenv("MMTE_THREADS", "5")
    assert th.choose_threads(None, 1) == (5, "MMTE_THREADS")
    assert th.choose_threads(7, 1) == (7, "--threads")
    monkeypatch.setenv("MMTE_THREADS", "many")
    with pytest.raises(ValueError) as e:
        th.choose_threads(None, 1)
    assert str(e.value) == "MMTE_THREADS must be a positive number of threads; got 'many'"


def test_local_ranks(keep_threads, monkeypatch):
    assert th.local_ranks(None, "cpu") == 1
    assert th.local_ranks(2, "cpu") == 2
    assert th.local_ranks("3", "cpu") == 3
    assert th.local_ranks([0, 1], "cpu") == 2
    assert th.local_ranks(4, "cuda") == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert th.local_ranks(1, "cpu") == 4


def _fit_args(tmp_path, *extra):
    return ["fit", "--config", os.fspath(ROOT / "recipes" / "quickstart.yaml"), "--config", os.fspath(ROOT / "configs" / "encoders" / "tiny.yaml"),
            "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", os.fspath(tmp_path / "run"), *extra]


def test_cli_sets_and_reports_threads(keep_threads, tmp_path, monkeypatch, capsys):
    import logging

    from mmte.cli import main

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    mlog = logging.getLogger("mmte")
    level = mlog.level
    mlog.addHandler(handler)
    mlog.setLevel(logging.INFO)
    try:
        torch.set_num_threads(2)
        assert main(_fit_args(tmp_path, "--threads", "1")) == 0
        assert torch.get_num_threads() == 1
        assert "torch threads: 1 (--threads; --threads N or MMTE_THREADS overrides)" in records
        assert not any(r.startswith("CPU allocator: ") for r in records)  # mmte leaves the C allocator as it is
        assert "threads: 1" in (next((tmp_path / "run" / "logs").glob("version_*")) / "config.yaml").read_text()
        cores = th.physical_cores()
        records.clear()
        assert main(_fit_args(tmp_path / "b")) == 0
        assert torch.get_num_threads() == cores
        assert f"torch threads: {cores} ({cores} physical core{'s' * (cores != 1)} / 1 local rank; --threads N or MMTE_THREADS overrides)" in records
    finally:
        mlog.removeHandler(handler)
        mlog.setLevel(level)
    monkeypatch.setenv("MMTE_THREADS", "0")
    assert main(_fit_args(tmp_path / "c")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "mmte: error: MMTE_THREADS must be a positive number of threads; got '0'"
