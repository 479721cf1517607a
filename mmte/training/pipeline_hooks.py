"""Pipeline-parallel hooks of :class:`~mmte.training.module.MMTEModule`.

:class:`~mmte.training.pipeline_runner.PipelineRunner` runs a pipeline schedule instead of Lightning's step
when ``pp > 1``; it asks the module for the schedule's inputs and targets, the loss of each microbatch and,
after the step, the outputs for the metrics (the model side is :mod:`mmte.model_stages`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .metrics import batch_size

__all__ = ["PipelineHooks"]


class PipelineHooks:
    """Mixin of :class:`~mmte.training.module.MMTEModule` (reads ``model``, ``log``, ``_update_metrics``,
    ``_log_metrics``): the pipeline part of :class:`~mmte.training.protocols.ParallelModule`."""

    #: the first stage describes what the stages pass each other (MetaTransformer.forward_stage(boundary=True))
    shares_pipeline_boundary = True

    def pipeline_inputs(self, batch: Mapping[str, Any]) -> tuple[tuple, dict[str, Any], torch.Tensor]:
        """``(args, kwargs, target)`` for the pipeline schedule: the first stage takes the modality inputs as
        ``batch=`` (the schedule splits them into microbatches); the targets and ids travel as the
        schedule's ``target`` (:meth:`MetaTransformer.pipeline_targets`), split the same way."""
        inputs = {k: v for k, v in batch.items() if k in self.model.modality_names}
        return (), {"batch": inputs}, self.model.pipeline_targets(batch)

    def set_pipeline_boundary(self, struct: str) -> None:
        self.model._pipeline_io["boundary"] = struct

    def pipeline_loss(self, output: Any, target: Any = None) -> torch.Tensor:
        """The last stage's loss of one microbatch (see :meth:`MetaTransformer.pipeline_loss`)."""
        return self.model.pipeline_loss(output, target)

    def pipeline_outputs(self, merged: Any, batch: Mapping[str, Any], stage: str, losses: list[torch.Tensor]) -> torch.Tensor | None:
        """On the rank holding the last stage, after a pipeline step: update the metrics from the merged
        outputs and return the batch's loss (the mean of the microbatch losses in training; recomputed
        from the outputs in evaluation). None on other ranks."""
        if merged is None:
            return None
        out = self.model.pipeline_unflatten(merged)
        self._update_metrics(out, batch, stage)
        if stage == "train":
            return torch.stack([x.detach().float() for x in losses]).mean()
        return self.model.loss(out, batch)["loss"].detach()

    def pipeline_log(self, batch: Mapping[str, Any], stage: str, loss: torch.Tensor) -> None:
        """Every rank logs the (shared) loss and every metric name, as torchmetrics' epoch-end
        synchronisation needs."""
        bs = batch_size(batch)
        self.log(f"{stage}_loss", loss, prog_bar=True, on_step=stage == "train", on_epoch=True, batch_size=bs, sync_dist=stage != "train")
        self._log_metrics(stage, bs)
