"""Callbacks: atomic checkpoints that pick their own monitor, and a prediction writer (CSV / JSON).

* :class:`MMTECheckpoint` is Lightning's ``ModelCheckpoint`` with two changes: ``monitor="auto"``
  takes the LightningModule's ``primary_metric`` (``val_acc`` for a classifier, ``val_mse`` for a
  forecaster...) and its mode, and every file is written to a temporary name in the same folder and
  renamed (``os.replace``), so a run killed mid-save never leaves a truncated ``last.ckpt`` behind.
  What goes *into* the checkpoint (trainable part only, plus the frozen part's source) is decided by
  :class:`mmte.training.module.MMTEModule`.
* :class:`PredictionWriter` gathers ``predict_step`` outputs and writes one row per sample (row id,
  per-head prediction, probability / value, target when known) to a CSV or JSON file, atomically, and
  prints the first rows.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import tempfile
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

logger = logging.getLogger(__name__)

__all__ = ["MMTECheckpoint", "PredictionWriter", "atomic_write"]


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class MMTECheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with ``monitor="auto"`` (the module's primary metric) and atomic saves.

    Args:
        monitor: a logged metric, ``"auto"``, or None (keep the latest only).
        mode: ``"min"``/``"max"``; ignored with ``monitor="auto"``.
        save_last: also keep ``last.ckpt`` (what ``--ckpt_path last`` resumes from).
        **kwargs: ``ModelCheckpoint`` options (dirpath, filename, save_top_k, every_n_epochs, ...).
    """

    def __init__(self, monitor: str | None = "auto", mode: str = "min", save_last: bool | None = True, save_top_k: int = 1, **kwargs: Any):
        self._auto = monitor == "auto"
        super().__init__(monitor=None if self._auto else monitor, mode=mode, save_last=save_last, save_top_k=save_top_k, **kwargs)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._auto:
            name, mode = getattr(pl_module, "primary_metric", ("val_loss", "min"))
            if mode not in ("min", "max"):
                raise ValueError(f"primary_metric mode must be 'min' or 'max'; got {mode!r}")
            self.monitor, self.mode = name, mode
            self.kth_value = torch.tensor(torch.inf if mode == "min" else -torch.inf)
            if self.filename is None:
                self.filename = "{epoch}-{step}-{" + name + ":.4f}"
            self._auto = False
        super().setup(trainer, pl_module, stage)

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        folder = os.path.dirname(os.path.abspath(filepath))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{os.path.basename(filepath)}")
        trainer.save_checkpoint(tmp, self.save_weights_only)
        trainer.strategy.barrier("mmte_checkpoint_written")  # every rank's shard is in place
        if trainer.is_global_zero and os.path.exists(tmp):
            if os.path.isdir(tmp) and os.path.isdir(filepath):
                # a distributed (sharded) checkpoint is a folder: swap folders, then drop the old one
                old = os.path.join(folder, f".old-{os.path.basename(filepath)}")
                if os.path.exists(old):
                    shutil.rmtree(old)
                os.replace(filepath, old)
                os.replace(tmp, filepath)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, filepath)
        trainer.strategy.barrier("mmte_checkpoint_rename")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            from weakref import proxy

            for lg in trainer.loggers:
                lg.after_save_checkpoint(proxy(self))


def _rows(outputs: list[dict[str, Any]], names: list[str] | None, class_names: list[str] | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for out in outputs:
        index = out.get("index")
        heads = {k: v for k, v in out.items() if k != "index"}
        n = next((int(t.shape[0]) for h in heads.values() for t in h.values() if isinstance(t, torch.Tensor) and t.dim() > 0), 0)
        for i in range(n):
            row: dict[str, Any] = {}
            idx = int(index[i]) if isinstance(index, torch.Tensor) else len(rows)
            row["id"] = names[len(rows)] if names and len(rows) < len(names) else idx
            for h, o in heads.items():
                prefix = f"{h}_" if len(heads) > 1 else ""
                if "pred" in o:
                    p = int(o["pred"][i])
                    row[prefix + "pred"] = class_names[p] if class_names and p < len(class_names) else p
                    row[prefix + "prob"] = round(float(o["prob"][i].max()), 6)
                if "value" in o:
                    v = o["value"][i]
                    row[prefix + "value"] = float(v) if v.numel() == 1 else v.tolist()
                for m, e in o.items():
                    if m not in ("pred", "prob", "value", "target"):
                        row[prefix + m] = e[i].tolist()
                if "target" in o:
                    t = o["target"][i]
                    if "pred" in o:
                        ti = int(t)
                        row[prefix + "target"] = class_names[ti] if class_names and ti < len(class_names) else ti
                    else:
                        row[prefix + "target"] = float(t) if t.numel() == 1 else t.tolist()
            rows.append(row)
    return rows


class PredictionWriter(Callback):
    """Write ``mmte predict`` results to a file and print the first rows.

    Args:
        output: ``.csv`` or ``.json`` path; None: ``predictions.csv`` in the trainer's log folder.
        print_rows: rows printed to stdout (0: none).
    """

    def __init__(self, output: str | None = None, print_rows: int = 10):
        super().__init__()
        if output is not None and not str(output).endswith((".csv", ".json")):
            raise ValueError(f"prediction output must end in .csv or .json; got {output!r}")
        self.output, self.print_rows = output, print_rows
        self._outputs: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.path: str | None = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._outputs = []

    def on_predict_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if isinstance(outputs, dict):
            self._outputs.append({k: ({m: t.detach().cpu() for m, t in v.items()} if isinstance(v, dict) else v.detach().cpu()) for k, v in outputs.items()})

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dm = trainer.datamodule
        names = dm.row_names(dm.predict_split) if dm is not None and hasattr(dm, "row_names") else None
        classes = getattr(dm, "class_names", None)
        self.rows = _rows(self._outputs, names, classes)
        if not trainer.is_global_zero:
            return
        path = self.output or os.path.join(trainer.log_dir or trainer.default_root_dir, "predictions.csv")
        if path.endswith(".json"):
            atomic_write(path, json.dumps(self.rows, indent=1))
        else:
            buf = io.StringIO()
            cols = list(dict.fromkeys(k for r in self.rows for k in r))
            w = csv.DictWriter(buf, fieldnames=cols)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
            atomic_write(path, buf.getvalue())
        self.path = path
        if self.print_rows:
            shown = self.rows[: self.print_rows]
            print(f"predictions ({len(self.rows)} rows) -> {path}")
            for r in shown:
                print("  " + ", ".join(f"{k}={_short(v)}" for k, v in r.items()))
            acc = _accuracy(self.rows)
            if acc is not None:
                print(f"  accuracy vs. target: {acc:.4f}")


def _short(v: Any) -> str:
    if isinstance(v, list):
        flat = v if not v or not isinstance(v[0], list) else [x for r in v for x in r]
        return "[" + ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in flat[:4]) + (", ...]" if len(flat) > 4 else "]")
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _accuracy(rows: list[dict[str, Any]]) -> float | None:
    if not rows or "pred" not in rows[0] or "target" not in rows[0]:
        return None
    return sum(r["pred"] == r["target"] for r in rows) / len(rows)
