"""Callbacks: atomic checkpoints with stable names, and a prediction writer (CSV / JSON).

* :class:`MMTECheckpoint` is Lightning's ``ModelCheckpoint`` with stable names and atomic writes:

  - ``last.ckpt`` is always the latest step: it is rewritten at every epoch end (and every other save),
    not only when a new best is found, and it is what ``--ckpt_path last`` resumes;
  - ``best.ckpt`` is the best checkpoint by the monitored metric (``monitor="auto"``: the module's
    ``primary_metric``, e.g. ``val_acc`` for a classifier); with ``save_top_k > 1`` the top-k files keep
    Lightning's metric names and ``best.ckpt`` is a copy of the best of them. A non-finite metric never
    makes a checkpoint "best". Without a monitor, ``best.ckpt`` is the latest;
  - a run into a folder that already has them overwrites ``last.ckpt``/``best.ckpt`` (no ``last-v1.ckpt``),
    so the paths in the README and the recipes never go stale;
  - every file (or distributed checkpoint folder) is written under a temporary name in the same folder and
    renamed (``os.replace``), so a crash never leaves a truncated checkpoint; a failed write (disk full,
    read-only folder) removes its temporary file and stops the run with one line saying why
    (:class:`~mmte.errors.RunError`), leaving the previous checkpoint intact.

  What goes *into* the checkpoint (trainable part only, plus the frozen part's source) is decided by
  :class:`mmte.training.module.MMTEModule`.
* :class:`PredictionWriter` gathers ``predict_step`` outputs and writes one row per sample (row id,
  per-head prediction, probability / value, target when known) to a CSV or JSON file, atomically, and
  prints the first rows.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["MMTECheckpoint", "PredictionWriter", "atomic_write", "atomic_write_with"]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _write_error(path: str, e: OSError) -> RunError:
    why = e.strerror or str(e)
    code = errno.errorcode.get(e.errno, "") if e.errno else ""
    return RunError(
        f"could not write {path} ({why}{', ' + code if code else ''}); its temporary file was removed and the previous "
        f"{os.path.basename(path)} (if any) is unchanged",
        "expected free disk space and a writable folder",
        "free some space or point --trainer.default_root_dir (or --checkpoint.dirpath) at another folder",
    )


def atomic_write_with(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp)`` for a temporary name in ``path``'s folder, then ``os.replace(tmp, path)``.

    On any failure the temporary file (or folder) is removed; an ``OSError`` becomes a
    :class:`~mmte.errors.RunError` saying why in one line."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=folder)
        os.close(fd)
    except OSError as e:
        raise _write_error(path, e) from e
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise _write_error(path, e) from e
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())

    atomic_write_with(path, write)


class MMTECheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` writing ``best.ckpt`` and ``last.ckpt`` atomically (see the module docstring).

    Args:
        monitor: a logged metric, ``"auto"`` (the module's ``primary_metric``), or None (no ranking: ``best.ckpt``
            is the latest).
        mode: ``"min"``/``"max"``; ignored with ``monitor="auto"``.
        save_last: keep ``last.ckpt``, the latest step (what ``--ckpt_path last`` resumes from).
        save_top_k: checkpoints ranked by the monitor to keep; with 1 (the default) it is ``best.ckpt``.
        filename: name template of the ranked checkpoints; default ``best`` with ``save_top_k=1``, else
            ``{epoch}-{step}-{<monitor>:.4f}`` (then ``best.ckpt`` is a copy of the best of them).
        enable_version_counter: False (default): a file of the same name is overwritten, never versioned.
        **kwargs: other ``ModelCheckpoint`` options (dirpath, every_n_epochs, every_n_train_steps, ...).
    """

    BEST = "best"

    def __init__(self, monitor: str | None = "auto", mode: str = "min", save_last: bool | None = True, save_top_k: int = 1,
                 filename: str | None = None, enable_version_counter: bool = False, **kwargs: Any):
        self._auto = monitor == "auto"
        if filename is None and save_top_k == 1:
            filename = self.BEST
        # "auto" stays a placeholder name until setup() knows the module's primary metric
        super().__init__(monitor=monitor, mode=mode, save_last=save_last, save_top_k=save_top_k, filename=filename,
                         enable_version_counter=enable_version_counter, **kwargs)
        self._last_saved_step = -1
        self._nonfinite_warned = False

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

    # ---------------------------------------------------------------------------- names
    def _last_path(self) -> str:
        return os.path.join(self.dirpath or "", self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)

    def _best_alias(self) -> str:
        return os.path.join(self.dirpath or "", self.BEST + self.FILE_EXTENSION)

    # ------------------------------------------------------------------- when to save last
    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """Always ``last.ckpt`` (never ``last-v1.ckpt``), rewritten in place."""
        if not self.save_last:
            return
        self.last_model_path = self._last_path()  # set before saving: it is part of the saved state
        self._save_checkpoint(trainer, self.last_model_path)
        self._last_saved_step = trainer.global_step

    def _ensure_last(self, trainer: Trainer) -> None:
        if self.save_last and self._last_saved_step != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        due = not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer)
        super().on_train_epoch_end(trainer, pl_module)
        if due:  # Lightning refreshes last only when a top-k save happened
            self._ensure_last(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        due = not self._should_skip_saving_checkpoint(trainer) and not self._should_save_on_train_epoch_end(trainer)
        super().on_validation_end(trainer, pl_module)
        if due:
            self._ensure_last(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.fast_dev_run and trainer.global_step > 0:
            self._ensure_last(trainer)  # e.g. max_steps ended mid-epoch

    def save_last_now(self, trainer: Trainer) -> str:
        """Write ``last.ckpt`` for the current step unless it was just written (used on SIGINT/SIGTERM)."""
        path = self._last_path()
        if self._last_saved_step != trainer.global_step or not os.path.exists(path):
            self.last_model_path = path
            self._save_checkpoint(trainer, path)
            self._last_saved_step = trainer.global_step
        return path

    # ------------------------------------------------------------------------- best
    def _save_monitor_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        current = monitor_candidates.get(self.monitor) if self.monitor else None
        if isinstance(current, torch.Tensor) and not bool(torch.isfinite(current).all()):
            if not self._nonfinite_warned:
                logger.warning("%s is %s at step %d: not ranked, never saved as best", self.monitor, current.item(), trainer.global_step)
                self._nonfinite_warned = True
            return
        super()._save_monitor_checkpoint(trainer, monitor_candidates)
        self._refresh_best_alias(trainer)

    def _save_none_monitor_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        super()._save_none_monitor_checkpoint(trainer, monitor_candidates)
        self._refresh_best_alias(trainer)

    def _refresh_best_alias(self, trainer: Trainer) -> None:
        """With ranked file names (save_top_k > 1), keep ``best.ckpt`` a copy of the best one."""
        best, alias = self.best_model_path, self._best_alias()
        if not best or os.path.abspath(best) == os.path.abspath(alias) or not trainer.is_global_zero or not os.path.exists(best):
            return

        def copy(tmp: str) -> None:
            if os.path.isdir(best):
                os.unlink(tmp)
                shutil.copytree(best, tmp)
            else:
                shutil.copyfile(best, tmp)

        atomic_write_with(alias, copy)

    # ----------------------------------------------------------------------- writing
    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        folder = os.path.dirname(os.path.abspath(filepath))
        tmp = os.path.join(folder, f".tmp-{os.path.basename(filepath)}")
        try:
            os.makedirs(folder, exist_ok=True)
            if trainer.is_global_zero and os.path.lexists(tmp):
                _remove(tmp)  # left by a killed run
            trainer.strategy.barrier("mmte_checkpoint_tmp")
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
                    if os.path.isdir(filepath) and not os.path.isdir(tmp):
                        shutil.rmtree(filepath)  # a file replaces an old sharded folder of the same name
                    os.replace(tmp, filepath)
        except OSError as e:
            if trainer.is_global_zero:
                _remove(tmp)
            raise _write_error(filepath, e) from e
        except BaseException:
            if trainer.is_global_zero:
                _remove(tmp)
            raise
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
