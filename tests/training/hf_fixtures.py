"""Hugging Face datasets built in tests: a generated classification table written as parquet shards (id, four
numbers, a category and a ``ClassLabel`` label) and a config for ``mmte fit`` that reads it with
:class:`~mmte.training.data.HFDataModule`. Shared by the streaming tests and the composition runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

FEATURES = ["f0", "f1", "f2", "f3", "cat"]
CLASSES = ["low", "mid", "high"]


def write_table_shards(d: Path, rows: int, shards: int, val_rows: int = 64, seed: int = 0) -> Path:
    """``rows`` training rows in ``shards`` equal parquet files ``train-<i>.parquet`` and ``val_rows`` in
    ``validation.parquet`` under ``d``; the label is a function of the numbers (learnable). Returns ``d``."""
    import datasets

    if rows % shards:
        raise ValueError(f"rows {rows} must split into {shards} equal shards")
    rng = np.random.default_rng(seed)
    n = rows + val_rows
    x = rng.normal(size=(n, 4)).astype(np.float32)
    label = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)
    feats = datasets.Features({"id": datasets.Value("int64"), **{f"f{j}": datasets.Value("float32") for j in range(4)},
                               "cat": datasets.Value("string"), "label": datasets.ClassLabel(names=CLASSES)})
    table = {"id": list(range(n)), **{f"f{j}": x[:, j].tolist() for j in range(4)}, "cat": [f"c{k % 3}" for k in range(n)], "label": label.tolist()}
    ds = datasets.Dataset.from_dict(table, features=feats)
    d.mkdir(parents=True, exist_ok=True)
    per = rows // shards
    for s in range(shards):
        ds.select(range(s * per, (s + 1) * per)).to_parquet(str(d / f"train-{s}.parquet"))
    ds.select(range(rows, n)).to_parquet(str(d / "validation.parquet"))
    return d


def table_config(d: Path, streaming: bool, batch_size: int = 16, head_dropout: float = 0.3, shuffle_buffer: int = 32) -> dict[str, Any]:
    """An ``mmte fit`` config (tabular tokenizer, tiny trainable backbone, classification head) over the shards of ``d``."""
    return {
        "seed_everything": 0,
        "precision": "32-true",
        "trainer": {"max_epochs": 2, "devices": 1, "num_sanity_val_steps": 0, "enable_progress_bar": False, "enable_model_summary": False,
                    "log_every_n_steps": 1, "limit_val_batches": 2},
        "model": {"tokenizers": {"tabular": {"name": "tabular"}}, "backbone": "tiny", "backbone_weights": None, "freeze": "none",
                  "heads": {"label": {"name": "classification", "pool": "cls", "hidden": 32, "dropout": head_dropout}}, "lr": 1.0e-3},
        "data": {"class_path": "mmte.training.data.HFDataModule",
                 "init_args": {"path": "parquet", "data_files": {"train": str(d / "train-*.parquet"), "validation": str(d / "validation.parquet")},
                               "columns": {"tabular": FEATURES}, "label_column": "label", "id_column": "id",
                               "streaming": streaming, "shuffle_buffer": shuffle_buffer, "batch_size": batch_size, "seed": 0}},
    }


FSDD_DIGITS = ("0", "1", "2")


def fsdd_subset(dst: Path, speakers, takes=range(4), digits=FSDD_DIGITS) -> list[str]:
    """Copy the FSDD recordings of ``speakers`` (digits ``digits``, takes ``takes``) into ``dst``; their paths."""
    import glob
    import shutil

    from tests.conftest import need_data

    fsdd = need_data(Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fsdd" / "recordings", "FSDD recordings")
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(glob.glob(str(Path(fsdd) / "*.wav"))):
        digit, spk, i = Path(f).stem.split("_")
        if spk in speakers and digit in digits and int(i) in takes:
            shutil.copy(f, dst)
    return sorted(glob.glob(str(dst / "*.wav")))


def save_fsdd(files: list[str], out: Path, digits=FSDD_DIGITS) -> Path:
    """The clips as a save_to_disk dataset: ``audio`` (Audio), ``digit`` (ClassLabel), ``speaker``, ``file``."""
    import os

    import datasets

    names = [os.path.basename(f) for f in files]
    ds = datasets.Dataset.from_dict({"audio": files, "digit": [n.split("_")[0] for n in names], "speaker": [n.split("_")[1] for n in names], "file": names})
    ds = ds.cast_column("audio", datasets.Audio()).cast_column("digit", datasets.ClassLabel(names=list(digits)))
    ds.save_to_disk(str(out))
    return out

