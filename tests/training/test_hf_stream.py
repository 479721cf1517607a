"""HFDataModule with ``streaming: true`` on generated parquet shards, through the real ``mmte fit``: under ddp (2
ranks) every row is read exactly once per epoch, each rank a disjoint part (asserted by the rows' ids);
shuffling by shards and a buffer differs between epochs; SIGTERM mid-epoch and ``--ckpt_path last`` end with
the uninterrupted run's weights and metrics within 1e-6 (fp32; the head's dropout makes the random
generators matter, the stream's position travels in the checkpoint)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.training.hf_fixtures import table_config, write_table_shards

ROOT = Path(__file__).resolve().parents[2]
ROWS, SHARDS = 256, 4
@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """``ROWS`` rows in ``SHARDS`` equal parquet shards (id, four numbers, a category, a ClassLabel label) and a validation file."""
    d = write_table_shards(tmp_path_factory.mktemp("stream"), ROWS, SHARDS)
    (d / "stream.yaml").write_text(yaml.safe_dump(table_config(d, streaming=True)))
    return d


def _env(d: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(d), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _fit_cmd(d: Path, root: Path, *extra: str) -> list[str]:
    return ["-m", "mmte", "fit", "--config", str(d / "stream.yaml"), "--trainer.default_root_dir", str(root), *extra]


def test_stream_reads_shards_and_knows_its_length(shards):
    from mmte.training.data import HFDataModule

    dm = HFDataModule("parquet", data_files={"train": str(shards / "train-*.parquet"), "validation": str(shards / "validation.parquet")},
                      columns={"tabular": ["f0", "f1", "f2", "f3", "cat"]}, label_column="label", id_column="id", streaming=True,
                      shuffle_buffer=32, batch_size=16)
    dm.setup("fit")
    assert dm.class_names == ["low", "mid", "high"] and len(dm.datasets["val"]) == 64
    loader = dm.train_dataloader()
    epochs = []
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)  # what Lightning does at every epoch's start
        epochs.append([int(i) for b in loader for i in b["index"]])
    assert len(loader) == ROWS // 16
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(ROWS)) and epochs[0] != epochs[1]


def test_a_stream_never_prepares_the_dataset_map_style(shards, monkeypatch):
    """Opening, checking and splitting a streamed dataset read it as a stream only: ``load_dataset`` without
    ``streaming`` would first convert every shard into an Arrow table (the whole dataset's time and memory)."""
    import datasets

    from mmte.training.data import HFDataModule

    calls, load = [], datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append(kwargs.get("streaming", False))
        return load(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    dm = HFDataModule("parquet", data_files={"train": str(shards / "train-*.parquet"), "validation": str(shards / "validation.parquet")},
                      columns={"tabular": ["f0", "f1", "f2", "f3", "cat"]}, label_column="label", streaming=True, batch_size=16)
    dm.setup("fit")
    assert len(dm.datasets["val"]) == 64 and len(dm.train_dataloader()) == ROWS // 16
    assert calls and all(calls), calls


@pytest.mark.slow
def test_ddp_ranks_read_disjoint_parts_every_row_once_per_epoch(shards, tmp_path):
    root = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(29700 + os.getpid() % 200),
           *_fit_cmd(shards, root, "--config", str(ROOT / "configs" / "parallel" / "ddp.yaml"), "--data.init_args.batch_size", "8",
                     "--trainer.callbacks+=tests.training.callbacks.SeenIds", "--trainer.callbacks.out", str(tmp_path / "ids"))]
    p = subprocess.run(cmd, cwd=ROOT, env=_env(shards), capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"ids-{r}.json").read_text()) for r in (0, 1)]
    for epoch in ("0", "1"):
        a, b = ranks[0][epoch], ranks[1][epoch]
        assert len(a) == len(b) == ROWS // 2 and not set(a) & set(b)
        assert sorted(a + b) == list(range(ROWS)), epoch


@pytest.mark.slow
def test_sigterm_mid_epoch_and_resume_equal_the_uninterrupted_run(shards, tmp_path):
    env = _env(shards)
    full = tmp_path / "full"
    p = subprocess.run([sys.executable, *_fit_cmd(shards, full)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    root = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, *_fit_cmd(shards, root, "--trainer.callbacks+=tests.training.callbacks.SignalAt", "--trainer.callbacks.step", "6")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("MMTE-TEST step 6"):
                proc.send_signal(signal.SIGTERM)
                break
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    saved = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    loader = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert saved["global_step"] == 6 and loader["dataset_state"] == {"epoch": 0, "rows": 6 * 16}  # the stream's position
    p = subprocess.run([sys.executable, *_fit_cmd(shards, root, "--ckpt_path", "last")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    a = torch.load(full / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    b = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert a["global_step"] == b["global_step"] == 2 * ROWS // 16
    diff = max((a["state_dict"][k].double() - b["state_dict"][k].double()).abs().max().item() for k in a["state_dict"])
    assert diff <= 1e-6, diff
