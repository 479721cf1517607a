"""Checkpoints of :class:`~mmte.training.strategy.MMTEStrategy`: portable files or DCP folders.

By default every layout (TP, FSDP2, DDP, PP, any mix) writes the file one process writes: full
tensors under the model's FQNs, merged across pipeline stages onto rank 0, and the optimizer state
keyed by parameter FQN (:mod:`mmte.training.portable`). With ``save_distributed_checkpoint`` each
rank writes its shards (torch.distributed.checkpoint) instead. Loading reads either, on every rank,
and each rank keeps its own slices of the full tensors, so a run may resume under another layout
(optimizer state resharded by FQN, group options included).

:class:`ShardedCheckpoints` is a mixin of the strategy (placed before Lightning's
``ModelParallelStrategy``, whose methods it extends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..parallel.materialize import copy_full
from .portable import FLAT, LIVE, consolidate, gather_full, is_flat, optim_from_flat, optim_to_flat
from .protocols import as_parallel_module

__all__ = ["ShardedCheckpoints"]


class ShardedCheckpoints:
    """Checkpoint saving and loading for a strategy with ``device_mesh``, ``dims`` and
    ``_save_distributed_checkpoint`` (:class:`~mmte.training.strategy.MMTEStrategy`)."""

    @property
    def lightning_restore_optimizer(self) -> bool:
        return True  # load_optimizer_state_dict below maps FQN-keyed states onto this rank's optimizer

    def _contributes(self) -> bool:
        """One rank per pipeline stage sends its full (gathered) tensors to rank 0."""
        return all(self.device_mesh[d].get_local_rank() == 0 for d in ("dp_replicate", "dp_shard", "tp"))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """Full tensors under the model's FQNs, merged across pipeline stages, on rank 0 (``{}`` elsewhere);
        DTensor shards with ``save_distributed_checkpoint``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        local = get_model_state_dict(self.lightning_module, options=StateDictOptions(full_state_dict=True))
        return gather_full({k: v.detach().cpu() for k, v in local.items()}, self._contributes())

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        """FQN-keyed (flattened) optimizer state: full and merged across stages on rank 0, or this rank's
        shards with ``save_distributed_checkpoint``."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        opt = _unwrap(optimizer)
        full = not self._save_distributed_checkpoint
        local: dict[str, Any] = {}
        if not _placeholder_only(opt):
            options = StateDictOptions(full_state_dict=full, flatten_optimizer_state_dict=True)
            local = get_optimizer_state_dict(self.lightning_module, opt, options=options)
            if full:
                local = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in local.items()}
        return gather_full(local, self._contributes()) if full else local

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        checkpoint.setdefault("mmte", {}).update(optimizer_format=FLAT, layout=self.dims.sizes())
        if self._save_distributed_checkpoint and isinstance(checkpoint.get("current_model_state"), dict):
            # Lightning saves only state_dict and the optimizer states as shards (the rest is rank 0's meta.pt):
            # the live weights beside averaged ones go with state_dict; consolidate() takes them out again
            live = checkpoint.pop("current_model_state")
            checkpoint["state_dict"] = {**checkpoint["state_dict"], **{f"{LIVE}{k}": v for k, v in live.items()}}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a portable file, or consolidate a distributed checkpoint folder in memory, on every rank;
        :meth:`load_model_state_dict` / :meth:`load_optimizer_state_dict` then take this rank's slices."""
        path = Path(self.broadcast(str(checkpoint_path)))
        if path.is_dir():
            return consolidate(path)
        return self.checkpoint_io.load_checkpoint(path, weights_only=False if weights_only is None else weights_only)

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        """Copy this rank's slice of each full tensor into the (sharded) model; strictly, FP8 scaling
        state aside (it follows the model, see :func:`~mmte.training.checkpoint_hooks.reconcile_fp8_state`)."""
        module = self.lightning_module
        sd = checkpoint["state_dict"]
        own = module.state_dict(keep_vars=True)
        missing = sorted(k for k in own if k not in sd)
        full = as_parallel_module(module).meta_model()
        known = set(own) | ({f"model.{k}" for k in full.state_dict()} if full is not None else set(sd))
        unexpected = sorted(k for k in sd if k not in known and not k.rsplit(".", 1)[-1].startswith("fp8_"))
        if strict and (missing or unexpected):
            raise ValueError(
                f"checkpoint does not fit the model: missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
                f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
            )
        for k, t in own.items():
            if k in sd:
                copy_full(t, sd[k].to(t.device if t.device.type != "meta" else "cpu"))

    def load_optimizer_state_dict(self, checkpoint) -> None:
        """Load a checkpoint's optimizer state into this rank's optimizer, whatever layout wrote it.

        The state is keyed by parameter FQN (a single-process checkpoint's positional state is converted
        first); each tensor is the full one and this rank keeps its slice of it where the parameter is a
        DTensor (TP / FSDP), the whole tensor otherwise; group options (lr, weight decay...) come along.
        """
        module = self.lightning_module
        local = dict(module.named_parameters())
        for opt, state in zip(self.optimizers, checkpoint.get("optimizer_states") or []):
            opt = _unwrap(opt)
            if _placeholder_only(opt):
                continue
            if not is_flat(state):  # a single-process checkpoint: positions follow the whole model's groups
                state = optim_to_flat(state, as_parallel_module(module).optimizer_param_names())
            ids = {id(p): n for n, p in local.items()}
            names = [[ids[id(p)] for p in g["params"]] for g in opt.param_groups]
            native = optim_from_flat(state, names)
            params = [p for g in opt.param_groups for p in g["params"]]
            for pid, per in native["state"].items():
                param = params[pid]
                for k, v in per.items():
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and tuple(v.shape) == tuple(param.shape):
                        dst = torch.zeros_like(param, dtype=v.dtype)
                        copy_full(dst, v.to(dst.to_local().device if hasattr(dst, "to_local") else dst.device))
                        per[k] = dst
            opt.load_state_dict(native)


def _unwrap(optimizer):
    """The torch optimizer inside Lightning's ``LightningOptimizer`` wrapper (or the optimizer itself)."""
    return getattr(optimizer, "_optimizer", optimizer)


def _placeholder_only(opt) -> bool:
    """An optimizer of a pipeline rank that holds nothing to train (see MMTEModule._param_groups)."""
    return all(getattr(p, "_mmte_placeholder", False) for g in opt.param_groups for p in g["params"])
