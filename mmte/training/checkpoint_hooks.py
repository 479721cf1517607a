"""Checkpoint hooks of :class:`~mmte.training.module.MMTEModule`: trainable-only checkpoints.

When the frozen backbone came from a source, ``on_save_checkpoint`` drops its tensors and records
``checkpoint["mmte"]["frozen"]`` = {source, keys, sha256 fingerprint}; ``on_load_checkpoint`` rebuilds
them from that source, checks the fingerprint and puts them back, so ``load_state_dict(strict=True)``
(Lightning's resume and ``load_from_checkpoint``) sees every key. A frozen backbone without a source
(random init) is saved. The same holds for ``checkpoint["current_model_state"]``, where ``ema_decay``
(:mod:`mmte.training.ema`) and Lightning's ``WeightAveraging`` callbacks (e.g. ``EMAWeightAveraging``) keep
the live weights while ``state_dict`` carries the averaged ones. Loading also reconciles FP8 scaling state with the model being loaded and
turns an FQN-keyed optimizer state (written under :class:`~mmte.training.strategy.MMTEStrategy`,
:mod:`mmte.training.portable`) back into torch's positional one for a single-process run.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch import nn

from ..encoders import Backbone, load_state_dict_file, normalize_backbone_keys
from ..encoders.sources import resolve_backbone_source
from .ema import put_in_checkpoint, take_from_checkpoint
from .portable import FLAT, optim_from_flat

logger = logging.getLogger(__name__)

__all__ = ["CheckpointHooks", "reconcile_fp8_state", "state_fingerprint"]


def state_fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the names, shapes, dtypes and bytes of ``tensors`` (sorted by name)."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        t = t.cpu().contiguous()
        h.update(f"{k}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def reconcile_fp8_state(sd: dict[str, Any], module: LightningModule) -> None:
    """FP8 scaling state (``*.fp8_*`` buffers) follows the model being loaded: a checkpoint from an FP8 run
    loads into a high-precision model without it, and one from a high-precision run into an FP8 model with
    fresh scaling state."""
    own = set(module.state_dict())
    extra = [k for k in sd if k.rsplit(".", 1)[-1].startswith("fp8_") and k not in own]
    for k in extra:
        del sd[k]
    fresh = [k for k in own if k.rsplit(".", 1)[-1].startswith("fp8_") and k not in sd]
    if fresh:
        current = module.state_dict()
        for k in fresh:
            sd[k] = current[k]
    if extra or fresh:
        logger.info("FP8 scaling state: dropped %d tensors the model does not use, started %d fresh", len(extra), len(fresh))


class CheckpointHooks:
    """Mixin of :class:`~mmte.training.module.MMTEModule` (reads ``hparams.backbone_weights``,
    ``hparams.save_frozen``, ``_full_meta()``, ``model``, ``optimizer_param_names``)."""

    def meta_model(self) -> nn.Module:
        """The whole model on the meta device: what a checkpoint describes, whatever this rank holds
        (:class:`~mmte.training.protocols.ParallelModule`)."""
        return self._full_meta()

    def _frozen_backbone_keys(self) -> list[str] | None:
        """State-dict keys (``model.backbone.*`` parameters of the whole model) restorable from the
        source, or None when the backbone is not entirely frozen or has no source."""
        if self.hparams.backbone_weights is None or self.hparams.save_frozen == "always":
            return None
        params = dict(self._full_meta().backbone.named_parameters())
        if any(p.requires_grad for n, p in params.items() if ".lora." not in n):
            return None
        # frozen *parameters* only: buffers (e.g. FP8 scaling state) are training state and stay saved
        return [f"model.backbone.{n}" for n, p in params.items() if not p.requires_grad and ".lora." not in n]

    def _source_state(self) -> dict[str, torch.Tensor]:
        """The backbone source's tensors under mmte backbone keys (normalised)."""
        src = resolve_backbone_source(self.hparams.backbone_weights)
        if isinstance(src, Backbone):
            sd = src.state_dict()
        else:
            sd = load_state_dict_file(src)
        return normalize_backbone_keys(sd, self._full_meta().backbone.config.num_attention_heads)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if getattr(self, "_ema", None) is not None:  # averaged weights as the checkpoint's, live ones beside them
            put_in_checkpoint(checkpoint, self._ema, self.trainer.strategy.lightning_module_state_dict)
        keys = self._frozen_backbone_keys()
        sd = checkpoint["state_dict"]
        if not keys or not sd or not all(k in sd for k in keys):
            return  # nothing to leave out, or not the rank that writes (distributed saves gather onto rank 0)
        for k in keys:
            del sd[k]
        live = checkpoint.get("current_model_state")  # a weight-averaging callback's live weights (written before us)
        if isinstance(live, dict):
            for k in keys:
                live.pop(k, None)
        if self._frozen_fingerprint is None:
            src = self._source_state()
            self._frozen_fingerprint = state_fingerprint({k: src[k.removeprefix("model.backbone.")] for k in keys})
        checkpoint.setdefault("mmte", {})["frozen"] = {
            "source": os.fspath(self.hparams.backbone_weights), "keys": keys, "sha256": self._frozen_fingerprint
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.model is None:
            self.configure_model()
        mm = checkpoint.get("mmte") or {}
        info = mm.get("frozen")
        if info:
            src = self._source_state()
            missing = [k for k in info["keys"] if k.removeprefix("model.backbone.") not in src]
            if missing:
                raise ValueError(f"the backbone source {info['source']!r} lacks the checkpoint's frozen keys {missing[:5]}; it was saved from another architecture")
            frozen = {k: src[k.removeprefix("model.backbone.")] for k in info["keys"]}
            fp = state_fingerprint(frozen)
            if fp != info["sha256"]:
                raise ValueError(
                    f"the frozen backbone rebuilt from {info['source']!r} differs from the one this checkpoint was trained with "
                    f"(sha256 {fp[:12]} != {info['sha256'][:12]}); point backbone_weights at the original weights"
                )
            self._frozen_fingerprint = fp
            checkpoint["state_dict"].update(frozen)
            if isinstance(checkpoint.get("current_model_state"), dict):
                checkpoint["current_model_state"].update(frozen)
        reconcile_fp8_state(checkpoint["state_dict"], self)
        if isinstance(checkpoint.get("current_model_state"), dict):
            reconcile_fp8_state(checkpoint["current_model_state"], self)
        # the loaded weights replace the model's: a running average is stale; a resumed fit starts it again
        # from the checkpoint's (mmte.training.ema)
        fitting = self._trainer is not None and self._trainer.state.fn == "fit"
        start = take_from_checkpoint(checkpoint, fitting)
        self._ema, self._ema_start = None, (start if self.hparams.get("ema_decay") is not None else None)
        strategy = getattr(self._trainer, "strategy", None) if self._trainer is not None else None
        if mm.get("optimizer_format") == FLAT and checkpoint.get("optimizer_states") and not hasattr(strategy, "parallel_config"):
            # written under MMTEStrategy (FQN-keyed): back to positions for this single-process optimizer
            names = self.optimizer_param_names(self.model)
            checkpoint["optimizer_states"] = [optim_from_flat(o, names) for o in checkpoint["optimizer_states"]]
            mm["optimizer_format"] = "torch"
