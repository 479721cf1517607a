"""Pipeline stages of :class:`~mmte.model.MetaTransformer`: what one stage of a split model runs.

:func:`mmte.parallel.pipeline_split` makes pruned views of a model (tokenizers on the first stage,
heads on the last, some backbone layers on each) and sets ``pipeline_stage`` on them; the model's
``forward`` then runs :meth:`PipelineStages.forward_stage`. Between stages the hidden states and the
token sequence's side information travel as flat tensors (:mod:`mmte.parallel.boundary`), and the
targets reach the last stage's loss through the schedule (:meth:`PipelineStages.pipeline_targets`).
The single-device model code (:mod:`mmte.model`) knows none of this beyond that dispatch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .parallel.boundary import pack, pack_rows, structure, unpack, unpack_rows
from .seq import TokenSeq

__all__ = ["PipelineStages"]


class PipelineStages:
    """Mixin of :class:`~mmte.model.MetaTransformer`: the pipeline-parallel entry points.

    It reads the model's ``tokenizers``/``backbone``/``heads`` (``None`` on the stages that do not
    hold them), ``fusion``, ``modality_names``, ``forward_tokens``, ``_joint``, ``forward_heads`` and
    ``loss``, and keeps its state in ``_pipeline_io`` (shared between a model's stage views).
    """

    def _first_stage(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        if self.fusion == "separate":
            raise ValueError("pipeline parallel runs one token sequence per sample: fusion 'single' or 'joint', not 'separate'")
        seqs = self.forward_tokens(batch)
        seq = self._joint(seqs) if self.fusion == "joint" else next(iter(seqs.values()))
        key = "joint" if self.fusion == "joint" else next(iter(seqs))
        mask = seq.full_mask()
        if not bool(mask[:, seq.num_prefix_tokens :].any(1).all()) and mask.shape[1] > seq.num_prefix_tokens:
            raise ValueError("every sample needs at least one real (unmasked) token after its prefix tokens; got a fully padded sample")
        extras = {k: v for k, v in seq.extras.items() if k != "sequences"}
        side = {"key": key, "mask": mask, "num_prefix_tokens": seq.num_prefix_tokens, "positions": seq.positions, "extras": extras}
        return {"x": seq.tokens, "seq": side}

    def pipeline_boundary(self, batch: Mapping[str, Any]) -> str:
        """The structure of what the stages pass each other for ``batch`` (see
        :mod:`mmte.parallel.boundary`); computed on the first stage's rank and shared by the strategy."""
        with torch.no_grad():
            return structure(self._first_stage(batch))

    def forward_stage(self, *inputs: torch.Tensor, batch: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, ...]:
        """One pipeline stage: this module is a pruned view (tokenizers on the first stage, heads on the
        last, some backbone layers on each; see :func:`mmte.parallel.pipeline_split`).

        * first stage: ``batch``, the microbatch's modality inputs; tokenizes (single or joint fusion);
        * every stage runs the backbone layers it holds; all but the last pass on the hidden states and
          the token sequence's side information (mask, prefix tokens, extras) as tensors
          (:func:`mmte.parallel.boundary.pack`; their structure, :meth:`pipeline_boundary`, is in
          ``_pipeline_io["boundary"]``);
        * the last stage applies the heads and returns their outputs flattened; :meth:`pipeline_loss`
          and :meth:`pipeline_unflatten` read them back. Targets reach the loss through the schedule's
          ``target`` (:func:`mmte.parallel.boundary.pack_rows`), not through the stages.
        """
        from torch.utils._pytree import tree_flatten

        first, last = self.tokenizers is not None, self.heads is not None
        known = self._pipeline_io.get("boundary")
        if first:
            if not isinstance(batch, Mapping):
                raise TypeError(f"the first pipeline stage takes the batch dict as batch=...; got {type(batch).__name__}")
            tree = self._first_stage(batch)
            if known is not None and structure(tree) != known:
                raise ValueError(
                    "pipeline parallel needs every microbatch to have the same structure (modalities present, mask, extras); "
                    "this one differs from the first"
                )
        else:
            if known is None:
                raise RuntimeError("pipeline stage boundary structure unknown: MMTEStrategy shares it before the first step")
            tree = unpack(inputs, known)
        side = tree["seq"]
        mask = side["mask"]
        x = self.backbone(tree["x"], None if bool(mask.all()) else mask)
        if not last:
            return pack({"x": x, "seq": side})
        # shape inference runs this on uninitialised tensors: a row without a real token there (the first
        # stage refuses such rows in real batches) means "no padding"
        npre = side["num_prefix_tokens"]
        if mask.shape[1] > npre:
            mask = mask | ~mask[:, npre:].any(1, keepdim=True)
        seq = TokenSeq(x, None if bool(mask.all()) else mask, side["num_prefix_tokens"], side.get("positions"), dict(side["extras"]))
        out = self.forward_heads({side["key"]: (x, seq)})
        flat, spec = tree_flatten(out)
        self._pipeline_io["out_spec"] = spec
        return tuple(flat)

    def pipeline_unflatten(self, flat: Sequence[torch.Tensor] | torch.Tensor) -> dict[str, Any]:
        """The heads' outputs from the last stage's (possibly microbatch-merged) output."""
        from torch.utils._pytree import tree_unflatten

        spec = self._pipeline_io.get("out_spec")
        if spec is None:
            raise RuntimeError("no pipeline output structure recorded: the last stage has not run yet on this rank")
        flat = [flat] if isinstance(flat, torch.Tensor) else list(flat)
        return tree_unflatten(flat, spec)

    def pipeline_targets(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The batch's per-sample tensors other than the modalities (targets, ids) packed into the one
        ``uint8 [B, bytes]`` tensor the schedule splits into microbatches for :meth:`pipeline_loss`."""
        carry = {k: v for k, v in batch.items() if k not in self.modality_names and isinstance(v, torch.Tensor) and v.dim() > 0}
        rows, self._pipeline_io["targets"] = pack_rows(carry)
        return rows

    def pipeline_loss(self, output: Sequence[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        """The loss of one microbatch: the last stage's output and the microbatch's rows of
        :meth:`pipeline_targets`."""
        return self.loss(self.pipeline_unflatten(output), unpack_rows(target, self._pipeline_io["targets"]))["loss"]
