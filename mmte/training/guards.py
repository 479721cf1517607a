"""Guards for a training run: nothing lost on a signal, nothing silent on a non-finite value.

* :class:`TrainingGuard` (a callback the ``mmte`` command always adds):

  - a non-finite training loss stops the run *before* its backward pass and optimizer step, with a
    :class:`~mmte.errors.RunError` naming the step, epoch and batch (the weights stay finite and no
    checkpoint of that step is written); a non-finite validation/test loss stops too;
  - SIGINT / SIGTERM during ``fit`` (see :mod:`mmte._signals`): at the next step boundary
    ``last.ckpt`` is written and the run stops with :class:`~mmte.errors.Interrupted` (exit status
    130 / 143). A signal during the epoch's last batch lets the epoch finish (validation and its
    checkpoint) first. ``--ckpt_path last`` resumes;
  - a checkpoint written mid-epoch also holds the random-number generators' states, restored before
    the next training step of the resumed run, so dropout masks match an uninterrupted run.

* :class:`ResumableDataLoader`: a ``DataLoader`` that Lightning can resume mid-epoch. Lightning skips
  the batches an interrupted epoch already used only for loaders with ``state_dict``/``load_state_dict``;
  this one records (epoch, batches served) and on resume skips that many batches at the sampler (no data
  is read for them). With :func:`~mmte.training.data.train_sampler` the rest of the epoch is
  then exactly what the uninterrupted run saw.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, Sampler

from .. import _signals
from ..errors import Interrupted, RunError

logger = logging.getLogger(__name__)

__all__ = ["ResumableDataLoader", "TrainingGuard"]


# -------------------------------------------------------------------------------- RNG states
def _rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from, as tensors/ints (loadable with ``weights_only``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    py = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": py[0], "state": list(py[1]), "gauss": py[2]},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------ guard
class TrainingGuard(Callback):
    """Non-finite losses end the run with an error; SIGINT/SIGTERM end it with a resumable checkpoint.

    Args:
        check_loss: stop on a non-finite training loss (before its backward pass).
        check_eval_loss: stop on a non-finite validation/test loss.
        handle_signals: save and stop on SIGINT/SIGTERM at the next step boundary.
    """

    def __init__(self, check_loss: bool = True, check_eval_loss: bool = True, handle_signals: bool = True):
        super().__init__()
        self.check_loss, self.check_eval_loss, self.handle_signals = check_loss, check_eval_loss, handle_signals
        self._restore_handlers = None
        self._rng_to_restore: dict[str, Any] | None = None

    # --------------------------------------------------------------------------- non-finite
    def _any_rank(self, trainer: Trainer, flag: bool) -> bool:
        if trainer.world_size <= 1:
            return flag
        return bool(trainer.strategy.reduce_boolean_decision(flag, all=False))

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if not self.check_loss or not isinstance(loss, torch.Tensor):
            return
        bad = not bool(torch.isfinite(loss.detach()).all())
        if self._any_rank(trainer, bad):
            bp = trainer.fit_loop.epoch_loop.batch_progress
            value = loss.detach().float().reshape(-1)[0].item() if bad else "non-finite on another rank"
            last = _last_checkpoint(trainer)
            raise RunError(
                f"the training loss is {value} at step {trainer.global_step} (epoch {trainer.current_epoch}, batch {max(bp.current.ready - 1, 0)}); "
                "stopped before its optimizer step",
                "expected a finite loss",
                "lower --model.lr, check the data for NaN/inf values or use fp32"
                + (f"; the last good checkpoint is {last} (resume with --ckpt_path last)" if last else ""),
            )

    def _check_eval(self, trainer: Trainer, outputs: Any, batch_idx: int, stage: str) -> None:
        if not self.check_eval_loss:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        bad = not bool(torch.isfinite(loss.detach()).all())
        if self._any_rank(trainer, bad):
            raise RunError(
                f"the {stage} loss is {loss.detach().float().reshape(-1)[0].item() if bad else 'non-finite on another rank'} at batch {batch_idx} "
                f"(epoch {trainer.current_epoch}, after step {trainer.global_step})",
                "expected finite losses",
                f"check the {stage} data for NaN/inf values (or a diverged model: lower --model.lr)",
            )

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._check_eval(trainer, outputs, batch_idx, "validation")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._check_eval(trainer, outputs, batch_idx, "test")

    # ------------------------------------------------------------------------------ signals
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        fl = trainer.fit_loop
        if fl.restarting and getattr(fl, "_combined_loader_states_to_load", None) and fl._combined_loader is not None:
            # Lightning loads the loaders' states only when it creates the train loader after restoring the
            # checkpoint; the LR schedule's estimated_stepping_batches created it before, so do it here and
            # start the iterator again (it has not yielded yet) so the skip applies.
            fl._load_combined_loader_states()
            if fl._data_fetcher is not None:
                iter(fl._data_fetcher)
        if self.handle_signals:
            # Lightning's own SIGTERM handler (set up before this hook) only stops after the step, exits 0
            # and saves nothing: mmte's replaces it; Lightning's teardown restores the previous handlers.
            self._restore_handlers = _signals.install()
            _signals.clear()  # nothing left over from an earlier fit in this process
            _signals.defer(True)

    def _stop_signal(self, trainer: Trainer) -> int | None:
        if not self.handle_signals:
            return None
        sig = _signals.pending_signal() or 0
        if trainer.world_size > 1:  # every rank stops at the same step (the checkpoint is collective)
            t = torch.tensor([float(sig)], device=trainer.strategy.root_device)
            sig = int(trainer.strategy.reduce(t, reduce_op="max").item())
        return sig or None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.check_loss and not pl_module.automatic_optimization:
            # manual optimisation (e.g. the pipeline schedule) has no backward hook: check the returned loss after the step
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor):
                bad = not bool(torch.isfinite(loss.detach()).all())
                if self._any_rank(trainer, bad):
                    raise RunError(f"the training loss is {loss.detach().float().reshape(-1)[0].item()} at step {trainer.global_step} "
                                   f"(epoch {trainer.current_epoch}, batch {batch_idx}; manual optimisation: after its optimizer step)",
                                   "expected a finite loss", "lower --model.lr or check the data for NaN/inf values")
        sig = self._stop_signal(trainer)
        if sig is None or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return  # last batch of the epoch: finish it (validation, epoch checkpoint), stop at the epoch end
        self._stop(trainer, sig)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sig = self._stop_signal(trainer)
        if sig is not None:
            self._stop(trainer, sig)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _signals.defer(False)  # a signal from now on stops at once; one already received is reported by mmte.cli

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            _signals.defer(False)

    def _stop(self, trainer: Trainer, sig: int) -> None:
        from .callbacks import MMTECheckpoint

        ck = next((c for c in trainer.checkpoint_callbacks if isinstance(c, MMTECheckpoint)), None)
        if ck is not None:
            path = ck.save_last_now(trainer)
        else:
            path = os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
            trainer.save_checkpoint(path)
        _signals.defer(False)
        name = Interrupted(sig).signal_name
        raise Interrupted(sig, f"stopped by {name} at step {trainer.global_step} (epoch {trainer.current_epoch}); saved {path}; "
                               "resume with --ckpt_path last")

    # ------------------------------------------------------------------- checkpoint extras
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        bp = trainer.fit_loop.epoch_loop.batch_progress
        mid_epoch = trainer.training and bp.current.processed > bp.current.completed and not bp.is_last_batch
        checkpoint["mmte_resume"] = {"mid_epoch": bool(mid_epoch), "rng": _rng_state() if mid_epoch else None}
        # a loader state at the end of its epoch means "the next epoch, from its start"
        states = ((checkpoint.get("loops") or {}).get("fit_loop", {}).get("state_dict") or {}).get("combined_loader") or []
        n = trainer.num_training_batches
        for s in states:
            if isinstance(s, dict) and s.get("mmte_resumable") and isinstance(n, int) and s["batches"] >= n:
                s["epoch"], s["batches"] = s["epoch"] + 1, 0

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        extra = checkpoint.get("mmte_resume") or {}
        self._rng_to_restore = extra.get("rng") if extra.get("mid_epoch") else None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._rng_to_restore is not None:
            _set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None


def _last_checkpoint(trainer: Trainer) -> str | None:
    for c in trainer.checkpoint_callbacks:
        p = getattr(c, "last_model_path", "")
        if p and os.path.exists(p):
            return p
    return None


# ------------------------------------------------------------------------- resumable loader
class _SkippingSampler(Sampler[int]):
    """Wraps the sampler a ``BatchSampler`` reads; skips the first ``n`` indices once when a resume asks
    for it (and the epoch matches). ``set_epoch`` and ``len`` pass through."""

    def __init__(self, sampler: Any):
        self.sampler = sampler
        self.pending: tuple[int, int] | None = None  # (epoch, indices to skip)
        self.skipped = 0  # indices skipped by the latest iteration

    @property
    def epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", 0))

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        pending, self.pending = self.pending, None
        it = iter(self.sampler)
        self.skipped = pending[1] if pending is not None and pending[0] == self.epoch else 0
        return itertools.islice(it, self.skipped, None) if self.skipped else it

    def __len__(self) -> int:
        return len(self.sampler)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` with ``state_dict``/``load_state_dict``: where in which epoch it stopped.

    Same arguments as ``DataLoader`` (it must be built with ``batch_size``, i.e. a ``BatchSampler``). Without a
    ``generator`` it uses its own, seeded from the sampler's (seed, epoch) at every iteration: starting an
    iteration then draws nothing from torch's global generator (a plain ``DataLoader`` draws its workers' base
    seed from it), so where Lightning happens to create the iterator -- before or after the module re-seeds at
    an epoch start, which differs between a fresh and a resumed run -- cannot change dropout masks, and
    worker seeds depend on the epoch only.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        self._own_generator = kwargs.get("generator") is None
        if self._own_generator:
            kwargs["generator"] = torch.Generator()
        super().__init__(*args, **kwargs)
        self._last_iter = None
        bs = self.batch_sampler
        if bs is not None and hasattr(bs, "sampler") and not isinstance(bs.sampler, _SkippingSampler):
            bs.sampler = _SkippingSampler(bs.sampler)

    def __iter__(self):
        if self._own_generator:
            epoch = int(getattr(self.sampler, "epoch", 0))
            self.generator.manual_seed((int(getattr(self.sampler, "seed", 0)) * 1_000_003 + epoch + 7_919) % (2**63))
        it = super().__iter__()
        self._last_iter = it
        return it

    def state_dict(self) -> dict[str, Any]:
        it = self._last_iter
        inner = getattr(self.batch_sampler, "sampler", None)
        skipped = getattr(inner, "skipped", 0) // max(1, int(self.batch_size or 1))
        served = int(getattr(it, "_num_yielded", 0)) + skipped if it is not None else 0
        return {"mmte_resumable": 1, "epoch": int(getattr(self.sampler, "epoch", 0)), "batches": served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("mmte_resumable"):
            return
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(int(state["epoch"]))
        inner = getattr(self.batch_sampler, "sampler", None)
        if isinstance(inner, _SkippingSampler):
            inner.pending = (int(state["epoch"]), int(state["batches"]) * int(self.batch_size or 1))
