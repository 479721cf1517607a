"""Exponential moving average (EMA) of the trainable weights, made to compose with sharding and checkpoints.

:class:`~mmte.training.module.MMTEModule` keeps, with ``ema_decay`` set, an averaged copy of each trainable
parameter and updates it after every optimizer step::

    avg <- d * avg + (1 - d) * weight,   d = min(ema_decay, (1 + n) / (10 + n))   (n: updates so far)

so the first updates follow the weights closely instead of being dominated by the initialisation. The copy
is made at the start of training from the parameters as the strategy left them, so under FSDP2 or tensor
parallelism it holds the same DTensor shards as the parameters (each rank averages its own slices), and
under pipeline parallelism each stage averages its own layers. Validation, test and predict run with the
averaged weights swapped in (swapped back afterwards), so the checkpoint chosen on validation is the one the
metrics describe.

Checkpoints carry both: ``state_dict`` holds the averaged weights (what ``mmte test``/``predict``,
``load_from_checkpoint`` and ``ckpt_path="best"`` load and evaluate), ``current_model_state`` the live
ones and ``checkpoint["mmte"]["ema"]`` the decay and update count. Resuming a fit puts the live weights back
in the model and the averaged ones back in the average, so a killed run goes on where it was.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["WeightEMA", "check_decay", "put_in_checkpoint", "take_from_checkpoint"]


def _fsdp_module_type() -> tuple[type, ...]:
    """FSDP2's module class (its place moved between torch releases), or none."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return ()
    return (FSDPModule,)


def check_decay(decay) -> float | None:
    """``ema_decay`` as given, checked: None (off) or a number in (0, 1)."""
    if decay is None:
        return None
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < float(decay) < 1.0:
        raise ValueError(f"ema_decay must be a number in (0, 1) (e.g. 0.99), or None for no weight averaging; got {decay!r}")
    return float(decay)


class WeightEMA:
    """The averaged copies of a module's trainable parameters (a plain object: never in ``state_dict()``
    or the optimizer).

    Args:
        module: the module whose ``requires_grad`` parameters are averaged (their names, as in its
            ``state_dict``, key the saved state).
        decay: the largest decay ``d`` (see the module docstring).
        start: full tensors by parameter name to start the average from (a resumed run's averaged
            weights); parameters not in it start from their current values.
        updates: the update count the average had (resumed runs).
    """

    def __init__(self, module: nn.Module, decay: float, start: Mapping[str, torch.Tensor] | None = None, updates: int = 0):
        from ..parallel.materialize import copy_full

        self.decay, self.updates = check_decay(decay), int(updates)
        self.names, self.params, self.avg = [], [], []
        # FSDP2 trees: a unit left gathered after a forward registers its gathered parameters; brought back to
        # the sharded state, the module holds its persistent sharded parameters, which are what is averaged
        kind = _fsdp_module_type()
        self._fsdp = [m for m in module.modules() if isinstance(m, kind)] if kind else []
        if self._fsdp and not hasattr(self._fsdp[0], "reset_iter_state"):
            raise RuntimeError(f"ema_decay under FSDP2 needs FSDPModule.reset_iter_state (torch {torch.__version__} lacks it); "
                               "use the torch of constraints.txt, or train without ema_decay")
        self._reshard()
        with torch.no_grad():
            for name, p in module.named_parameters():
                if not p.requires_grad or p.numel() == 0:
                    continue
                a = p.detach().clone()
                if start is not None and name in start:
                    copy_full(a, start[name].to(a.device))
                self.names.append(name)
                self.params.append(p)
                self.avg.append(a)
        self.swapped = False  # True while the averaged weights are in the parameters
        if start is not None:
            missing = [n for n in self.names if n not in start]
            if missing:
                logger.warning("weight EMA: the checkpoint's average lacks %d tensors (%s...); they start from the live weights",
                               len(missing), ", ".join(missing[:3]))

    def _reshard(self) -> None:
        """Bring every FSDP2 tree back to its clean between-steps state (pending all-gathers dropped, all
        parameters sharded), so that the next forward gathers the values the sharded parameters hold now.
        Without it a unit that keeps its gathered parameters after forward (the root, mmte's last unit) keeps
        what an evaluation forward gathered, and the next training step would run on the averaged weights
        (tests/parallel/test_composition.py caught this: fsdp's losses left one process's after a validation)."""
        for m in self._fsdp:
            # FSDP picks its roots at the first forward (under pipeline parallelism not the outermost module):
            # before that nothing is gathered; after it, resetting a root resets the units under it
            if getattr(m._get_fsdp_state(), "_is_root", None):
                m.reset_iter_state()

    def current_decay(self) -> float:
        n = self.updates
        return min(self.decay, (1.0 + n) / (10.0 + n))

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average towards the live weights (call after each optimizer step)."""
        if self.swapped:
            raise RuntimeError("weight EMA update while the averaged weights are swapped in")
        w = 1.0 - self.current_decay()
        for a, p in zip(self.avg, self.params):
            a.lerp_(p.detach(), w)
        self.updates += 1

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the parameters' values with the averaged ones (in place: sharded parameters stay
        the tensors their runtime registered)."""
        self._reshard()  # first: whatever an FSDP unit gathered is dropped, the next forward gathers the new values
        for a, p in zip(self.avg, self.params):
            tmp = p.detach().clone()
            p.copy_(a)
            a.copy_(tmp)
        self.swapped = not self.swapped

    @contextlib.contextmanager
    def holding(self, averaged: bool) -> Iterator[None]:
        """Within the block the parameters hold the averaged (``averaged=True``) or the live weights;
        afterwards whatever they held before."""
        flip = averaged != self.swapped
        if flip:
            self.swap()
        try:
            yield
        finally:
            if flip:
                self.swap()

    def info(self) -> dict:
        return {"decay": self.decay, "updates": self.updates}


def put_in_checkpoint(checkpoint: dict, ema: WeightEMA, state_dict_fn) -> None:
    """Make ``checkpoint["state_dict"]`` the averaged weights and ``checkpoint["current_model_state"]``
    the live ones, whichever the parameters hold now. ``state_dict_fn`` is the strategy's
    ``lightning_module_state_dict`` (gathered or sharded the same way as the checkpoint's own); it is
    called once, on every rank, with the other set of weights swapped in."""
    if "current_model_state" in checkpoint:
        raise ValueError("the checkpoint already holds live weights beside averaged ones (a WeightAveraging callback?); use ema_decay or the callback, not both")
    with ema.holding(not ema.swapped):
        other = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state_dict_fn().items()}
    now = checkpoint["state_dict"]  # may share storage with the parameters: they hold these values again
    checkpoint["state_dict"], checkpoint["current_model_state"] = (now, other) if ema.swapped else (other, now)
    checkpoint.setdefault("mmte", {})["ema"] = ema.info()


def take_from_checkpoint(checkpoint: dict, fitting: bool) -> tuple[dict, int] | None:
    """For a fit that resumes from a checkpoint with a weight average: put its live weights in
    ``state_dict`` (what the model and the optimizer state go on from) and return ``(averaged weights,
    update count)``. Otherwise (test, predict, validate, ``load_from_checkpoint``) the averaged weights stay
    the ones loaded, and None is returned."""
    info = (checkpoint.get("mmte") or {}).get("ema")
    live = checkpoint.get("current_model_state")
    if not info or not isinstance(live, dict) or not fitting:
        return None
    avg = checkpoint["state_dict"]
    checkpoint["state_dict"] = checkpoint.pop("current_model_state")
    return avg, int(info.get("updates", 0))
