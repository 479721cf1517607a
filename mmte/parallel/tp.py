"""Tensor and sequence parallelism for the :class:`~mmte.encoders.Backbone` (DTensor).

Plans are pure functions of a backbone: they read which layers and norms exist and return
``{fqn_glob: ParallelStyle}`` relative to the backbone, which :func:`apply_tp` hands to
``torch.distributed.tensor.parallel.parallelize_module``.

Megatron's split, per layer:

* ``self_attention.layernorm_qkv.linear`` and ``layernorm_mlp.fc1`` / ``.up``: column-wise. The fused
  QKV weight is stored head-interleaved ``[H, 3, head_dim]``, so each rank's column block is whole
  heads; ``MultiheadAttention`` reads the local head count from the GEMM output.
* ``self_attention.proj`` and ``layernorm_mlp.fc2``: row-wise (one all-reduce per block).

With sequence parallelism the tokens between the blocks stay split along the sequence (``Shard(1)``):
the norms (and the dropouts of the residual branches, which act on whatever a rank holds) run on a
rank's slice; the column-wise GEMMs all-gather the sequence and the row-wise ones reduce-scatter it.
The first layer of the (stage's) backbone cuts the replicated tokens into slices and the last layer
gathers them again, so everything outside the backbone (tokenizers, heads) sees ordinary tensors.
Every module returns a plain local tensor (``use_local_output=True``): a residual sum of a DTensor and
a local tensor is an error in DTensor.

Sequence parallelism needs the token count to be a multiple of ``tp``; :func:`apply_tp` pads the
tokens (and the mask, with False) before the backbone and trims after it, so the padding is never
attended to and never seen by the caller.
"""

from __future__ import annotations

import fnmatch
import logging

import torch
from torch import nn

from ..te.stack import find_stacks

logger = logging.getLogger(__name__)

__all__ = ["apply_tp", "find_backbones", "glob_matches", "pad_for_sequence_parallel", "tp_plan"]


def _norm_types() -> tuple[type, ...]:
    return (nn.LayerNorm, nn.RMSNorm)


def find_backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(fqn, module)`` of every backbone (:class:`~mmte.te.TransformerStack`, e.g. an
    :class:`~mmte.encoders.Backbone`) in ``model``, outermost only."""
    return find_stacks(model)


def glob_matches(module: nn.Module, glob: str) -> list[str]:
    """FQNs of ``module``'s submodules matching a plan key, atom by atom (as ``parallelize_module``)."""
    atoms = glob.split(".")
    out = []
    for name, _ in module.named_modules():
        parts = name.split(".") if name else []
        if len(parts) == len(atoms) and all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms)):
            out.append(name)
    return out


def _present(backbone: nn.Module, glob: str, types: tuple[type, ...] | None = None) -> bool:
    for name in glob_matches(backbone, glob):
        if types is None or isinstance(backbone.get_submodule(name), types):
            return True
    return False


def _adapter_styles():
    """Column-/row-wise styles that also shard a linear's low-rank adapter (a child module holding ``A``
    [r, in] and ``B`` [out, r], e.g. :class:`mmte.model.LoRA`): column-wise, ``B`` is split with the
    output rows and ``A`` replicated; row-wise, ``A`` is split with the input columns and ``B``
    replicated, so the adapter's partial sums join the base GEMM's before its reduction (the adapter's
    forward hook runs before the style's output hook). torch's own styles register every parameter of
    the subtree on the linear itself and fail on such a child."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def shard_adapters(module, mesh, a_place, b_place, src):
        for child in module.children():
            params = dict(child.named_parameters(recurse=False))
            if set(params) >= {"A", "B"}:
                for pname, place in (("A", a_place), ("B", b_place)):
                    p = params[pname]
                    child.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [place], src_data_rank=src), requires_grad=p.requires_grad))

    class Colwise(ColwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            if name:  # distribute_module visits the subtree: the adapter was handled with its linear
                return
            for pname, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(pname, nn.Parameter(distribute_tensor(p, device_mesh, [Shard(0)], src_data_rank=self.src_data_rank), requires_grad=p.requires_grad))
            shard_adapters(module, device_mesh, Replicate(), Shard(0), self.src_data_rank)

    class Rowwise(RowwiseParallel):
        def _partition_linear_fn(self, name, module, device_mesh):
            if name:
                return
            super()._partition_linear_fn(name, module, device_mesh)
            shard_adapters(module, device_mesh, Shard(1), Replicate(), self.src_data_rank)

    return Colwise, Rowwise


def tp_plan(backbone: nn.Module, *, sequence_parallel: bool = False) -> dict:
    """The tensor(-and-sequence)-parallel plan of a backbone.

    Args:
        backbone: a :class:`~mmte.encoders.Backbone` (or a pipeline stage's part of one).
        sequence_parallel: also split norms/dropouts along the sequence between the blocks.

    Returns:
        ``{fqn_glob: ParallelStyle}`` relative to ``backbone``; every key matches at least one module.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        SequenceParallel,
    )

    ColwiseParallel, RowwiseParallel = _adapter_styles()

    layers = list(getattr(backbone, "layers", {}).keys())
    if not layers:
        raise ValueError("tp_plan: the backbone has no layers to parallelise")
    between = Shard(1) if sequence_parallel else Replicate()
    plan: dict = {
        "layers.*.self_attention.layernorm_qkv.linear": ColwiseParallel(input_layouts=between),
        "layers.*.self_attention.proj": RowwiseParallel(output_layouts=between),
        "layers.*.layernorm_mlp.fc1": ColwiseParallel(input_layouts=between),
        "layers.*.layernorm_mlp.fc2": RowwiseParallel(output_layouts=between),
    }
    if _present(backbone, "layers.*.layernorm_mlp.up", (nn.Linear,)):
        plan["layers.*.layernorm_mlp.up"] = ColwiseParallel(input_layouts=between)
    if sequence_parallel:
        for glob in (
            "layers.*.self_attention.layernorm_qkv.norm",
            "layers.*.layernorm_mlp.norm",
            "layers.*.post_attention_layernorm",
            "layers.*.post_mlp_layernorm",
        ):
            if _present(backbone, glob, _norm_types()):
                plan[glob] = SequenceParallel(use_local_output=True)
        first, last = f"layers.{layers[0]}", f"layers.{layers[-1]}"
        # a layer is called as layer(x, mask): slice x along the sequence, leave the (full) mask alone
        cut = {"input_layouts": (Replicate(), None), "desired_input_layouts": (Shard(1), None), "use_local_input": True}
        gather = {"output_layouts": Shard(1), "desired_output_layouts": Replicate(), "use_local_output": True}
        if first == last:
            plan[first] = PrepareModuleInputOutput(**cut, **gather)
        else:
            plan[first] = PrepareModuleInput(**{k.replace("use_local_input", "use_local_output"): v for k, v in cut.items()})
            plan[last] = PrepareModuleOutput(**gather)
    return plan


def pad_for_sequence_parallel(backbone: nn.Module, multiple: int) -> None:
    """Pad the backbone's tokens to a multiple of ``multiple`` (mask False on the padding) and trim after.

    Installed as forward hooks on a backbone that holds its first and last layers (the whole backbone);
    a no-op when the token count already fits.
    """

    def pre(module, args, kwargs):
        x = args[0] if args else kwargs["x"]
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        n = x.shape[1]
        extra = (-n) % multiple
        module._mmte_sp_len = n
        if extra == 0:
            return None
        x = torch.cat([x, x.new_zeros(x.shape[0], extra, x.shape[2])], 1)
        real = mask if mask is not None else torch.ones(x.shape[0], n, dtype=torch.bool, device=x.device)
        mask = torch.cat([real, real.new_zeros(x.shape[0], extra)], 1)
        return (x, mask), {}

    def post(module, args, kwargs, out):
        n = getattr(module, "_mmte_sp_len", out.shape[1])
        return out if out.shape[1] == n else out[:, :n]

    backbone.register_forward_pre_hook(pre, with_kwargs=True)
    backbone.register_forward_hook(post, with_kwargs=True)


def _require_multiple(backbone: nn.Module, tp: int) -> None:
    """A pipeline stage's part of a backbone cannot pad (the next stage would not know to trim): check."""

    def pre(module, args, kwargs):
        x = args[0] if args else kwargs["x"]
        if x.shape[1] % tp:
            raise ValueError(
                f"sequence parallel inside a pipeline stage needs the token count ({x.shape[1]}) to be a multiple "
                f"of tp={tp}; pad the tokens (mask False) before the backbone or turn sequence_parallel off"
            )

    backbone.register_forward_pre_hook(pre, with_kwargs=True)


def _check_divisible(backbone: nn.Module, tp: int) -> None:
    cfg = getattr(backbone, "config", None)
    if cfg is None:
        return
    if cfg.num_attention_heads % tp:
        raise ValueError(f"tp={tp} does not divide the number of attention heads {cfg.num_attention_heads}")
    if cfg.ffn_hidden_size % tp:
        raise ValueError(f"tp={tp} does not divide the MLP width ffn_hidden_size={cfg.ffn_hidden_size}")


def apply_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool = False, pad_sequence: bool = True) -> nn.Module:
    """Shard every backbone inside ``model`` over ``tp_mesh`` (in place); tokenizers and heads stay replicated.

    Args:
        model: a model (or pipeline stage) containing one or more backbones.
        tp_mesh: the 1-d ``"tp"`` sub-mesh.
        sequence_parallel: see :func:`tp_plan`.
        pad_sequence: with sequence parallelism, pad tokens to a multiple of the TP degree (only when
            this module holds the backbone's first and last layer; a pipeline stage must get a
            multiple already).

    Returns:
        ``model``.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    backbones = find_backbones(model)
    if not backbones:
        raise ValueError(f"apply_tp: no mmte Backbone found inside {type(model).__name__}")
    n_gemm = 0
    for fqn, bb in backbones:
        _check_divisible(bb, tp)
        plan = tp_plan(bb, sequence_parallel=sequence_parallel)
        parallelize_module(bb, tp_mesh, plan)
        n_gemm += sum(len(glob_matches(bb, g)) for g in plan)
        if sequence_parallel and pad_sequence:
            keys = list(bb.layers.keys())
            num = getattr(getattr(bb, "config", None), "num_layers", None)
            if num is None or (keys[0] == "0" and keys[-1] == str(num - 1)):
                pad_for_sequence_parallel(bb, tp)
            else:
                _require_multiple(bb, tp)
    logger.info(
        "tensor parallel tp=%d%s: sharded %d modules in %d backbone(s)",
        tp,
        " with sequence parallel" if sequence_parallel else "",
        n_gemm,
        len(backbones),
    )
    return model
