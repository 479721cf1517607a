"""The pipeline-parallel step of :class:`~mmte.training.strategy.MMTEStrategy`.

With ``pp > 1`` Lightning's own step cannot run: each rank holds some stages of the model, and a
torch.distributed.pipelining schedule moves microbatches between them. :class:`PipelineRunner` runs
one batch through the parallelised model (:func:`mmte.parallel.parallelize`'s result) and gives
every rank of the pipeline the same loss, so all of them log the same names:

* training: zero_grad -> ``schedule.step`` (forward + backward over equal microbatches) -> optimizer
  step -> per-step learning-rate schedulers;
* evaluation: the whole batch forward through the stages in order
  (:func:`~mmte.parallel.pipeline.forward_only`).

It talks to the LightningModule through :class:`~mmte.training.protocols.ParallelModule`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..parallel import ParallelConfig
from ..parallel.pipeline import forward_only, microbatches_for
from .protocols import ParallelModule

__all__ = ["PipelineRunner"]


class PipelineRunner:
    """Runs batches through a pipeline-parallel model.

    Args:
        parallelized: what :func:`mmte.parallel.parallelize` returned (stages, schedule, placement).
        mesh: the strategy's device mesh (its ``pp`` dimension links the stages).
        config: the strategy's :class:`~mmte.parallel.ParallelConfig`.
        pp: the pipeline degree.
        device: this rank's device (where the shared loss is reduced).
    """

    def __init__(self, parallelized: Any, mesh: Any, config: ParallelConfig, pp: int, device: torch.device) -> None:
        self.parallelized = parallelized
        self.mesh = mesh
        self.config = config
        self.pp = pp
        self.device = device
        self._boundaries: dict[tuple, Any] = {}

    def train_step(self, api: ParallelModule, batch: Any, optimizers: list, schedulers: list, context) -> torch.Tensor | None:
        """One optimisation step on ``batch``: zero_grad, the schedule, ``step()`` of ``optimizers``
        (Lightning's wrappers, whose step advances the trainer's global step) and of the ``interval:
        step`` entries of ``schedulers`` (Lightning's scheduler configs); under ``context`` (the
        precision plugin's train-step context)."""
        with context:
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss = self.step(api, batch, "train")
            for opt in optimizers:
                opt.step()
            for cfg in schedulers:
                if cfg.interval == "step":
                    cfg.scheduler.step()
        return loss

    def step(self, api: ParallelModule, batch: Any, stage: str) -> torch.Tensor | None:
        """Run the schedule on one batch and hand the last stage's merged outputs to
        ``api.pipeline_outputs`` on every rank (None where the rank holds no last stage); returns the
        loss every rank of the pipeline shares.

        Training (``stage="train"``): the schedule, forward + backward over equal microbatches (the
        largest count up to ``microbatches`` that divides the batch and that the schedule accepts); a
        batch that cannot be split so (an epoch's short last batch) is skipped with a warning (None).
        Evaluation: the whole batch forward through the stages in order (any batch size, any schedule's
        placement, no bubble-filling needed).
        """
        par, cfg = self.parallelized, self.config
        args, kwargs, target = api.pipeline_inputs(batch)
        n = int(target.shape[0])
        train = stage == "train"
        if train:
            m = microbatches_for(n, cfg.pp_schedule, cfg.microbatches, self.pp, par.schedule._num_stages)
            if m is None:
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(
                    f"skipped a training batch of {n} samples: {cfg.pp_schedule} with pp={self.pp} needs it split into "
                    f"equal microbatches (at most {cfg.microbatches}); use batch sizes that are a multiple of {cfg.microbatches}"
                )
                return None
        key = (train, _shape_key((args, kwargs)))
        if api.shares_pipeline_boundary:
            api.set_pipeline_boundary(self._boundary(key, kwargs))
        losses: list[torch.Tensor] = []
        if train:
            sched = par.schedule_for(key, m)
            kw = {"target": target, "losses": losses} if par.has_last_stage else {}
            if par.has_first_stage:
                kw.update(kwargs)
            out = sched.step(*args, **kw) if par.has_first_stage else sched.step(**kw)
        else:
            out = forward_only(par.stage_modules, par.owners, self.mesh["pp"].get_group(), *args, **kwargs)
        local = api.pipeline_outputs(out if par.has_last_stage else None, batch, stage, losses)
        # the last stage's loss reaches every rank of the pipeline
        has = local is not None
        local = (local.detach().float() if has else torch.zeros(())).to(self.device)
        holders = torch.tensor([1.0 if has else 0.0], device=self.device)
        pp_group = self.mesh["pp"].get_group()
        torch.distributed.all_reduce(local, group=pp_group)
        torch.distributed.all_reduce(holders, group=pp_group)
        loss = local / holders.clamp(min=1.0)
        api.pipeline_log(batch, stage, loss)
        return loss

    def _boundary(self, key: tuple, kwargs: dict[str, Any]) -> Any:
        """What the stages will pass each other, told by the first stage's rank to the other pipeline
        ranks (once per batch shape): shape inference on the later stages runs on uninitialised tensors,
        so the structure cannot travel inside them. It is computed by calling the first stage itself (on
        one sample) so FSDP2-sharded tokenizers run inside their root's forward."""
        if key not in self._boundaries:
            first = dict(self.parallelized.stage_modules).get(0)
            obj = [None]
            if first is not None:
                one = tree_map(lambda t: t[:1] if isinstance(t, torch.Tensor) and t.dim() > 0 else t, kwargs)
                with torch.no_grad():
                    obj = [first(**one, boundary=True)]
            group = self.mesh["pp"].get_group()
            torch.distributed.broadcast_object_list(obj, src=torch.distributed.get_global_rank(group, 0), group=group)
            self._boundaries[key] = obj[0]
        return self._boundaries[key]


def _shape_key(tree) -> tuple:
    leaves, _ = tree_flatten(tree)
    return tuple((tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in leaves)
