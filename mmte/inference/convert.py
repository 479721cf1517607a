"""The CPU conversion of an inference copy: module swaps that put prepacked GEMMs and flat layers in.

:func:`pack` turns every frozen :class:`~mmte.te.Linear` whose weight oneDNN can prepack into a
:class:`~mmte.inference.prepack.PackedLinear` and every plain :class:`~mmte.te.TransformerLayer` into a
:class:`~mmte.inference.layer.PackedTransformerLayer`, the way ``mmte.fp8.convert`` swaps in FP8
linears. The swap changes the class of each module in place: parameters, buffers, hooks (a LoRA
adapter's) and FQNs stay, so state dicts load either way and :func:`unpack` undoes it. Other GEMMs (an
FP8 linear, a trainable one) are left as they are and run through their own forward.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..te.linear import Linear
from ..te.stack import TransformerStack
from ..te.transformer import LayerScale, TransformerLayer
from .layer import PackedTransformerLayer
from .prepack import _ATTR, SMALL_ROWS, PackedLinear, _Packed, available, small_available

logger = logging.getLogger(__name__)

__all__ = ["pack", "prepack_stack", "unpack"]


def pack(module: nn.Module, rows: int = 1) -> int:
    """Swap prepacked GEMMs and flat layers into ``module`` (itself included), in place.

    A :class:`~mmte.te.Linear` is packed when its weight is a plain CPU tensor in fp32 or bf16 that
    :func:`~mmte.inference.prepack.available` supports, and not trained.

    Args:
        module: a model or any part of one.
        rows: the typical number of input rows (batch x tokens) that oneDNN tunes the layout for; any
            row count runs correctly.

    Returns:
        how many GEMM modules were packed.
    """
    n = 0
    for m in module.modules():
        w = getattr(m, "weight", None)
        if type(m) is not Linear or w is None or type(w.data) is not torch.Tensor:
            continue
        if w.device.type != "cpu" or w.requires_grad or not available(w.dtype):
            continue
        m.__class__ = PackedLinear
        setattr(m, _ATTR, _Packed(max(1, int(rows))))
        n += 1
    for m in module.modules():
        if type(m) is TransformerLayer:
            m.__class__ = PackedTransformerLayer
    return n


def unpack(module: nn.Module) -> int:
    """Undo :func:`pack` on ``module``; returns how many GEMM modules it unpacked."""
    n = 0
    for m in module.modules():
        if type(m) is PackedLinear:
            m.__class__ = Linear
            m.__dict__.pop(_ATTR, None)
            n += 1
        elif type(m) is PackedTransformerLayer:
            m.__class__ = TransformerLayer
    return n


def prepack_stack(stack: TransformerStack, dtype: str, rows: int = 128) -> tuple[int, bool]:
    """Convert one transformer stack of a CPU inference copy: :func:`pack` its GEMMs and layers and, in
    ``"bf16"`` where every GEMM is packed and fbgemm runs, switch on the small-row path (inputs of at
    most :data:`~mmte.inference.prepack.SMALL_ROWS` rows in fp32 on fp16-packed weights; the norms and
    layer scales go to fp32, which both paths read).

    Args:
        stack: the (already cast) stack.
        dtype: ``"bf16"`` or ``"fp32"``.
        rows: the row count oneDNN tunes the layouts for.

    Returns:
        ``(GEMMs packed, small-row path on)``.
    """
    gemms = sum(isinstance(mod, nn.Linear) for mod in stack.layers.modules())
    n_layers = sum(isinstance(mod, TransformerLayer) for mod in stack.layers.modules())
    packed = pack(stack, rows=rows)
    flat = sum(type(mod) is PackedTransformerLayer for mod in stack.layers.modules())
    logger.info("packed %d/%d Linear GEMM weights for oneDNN (%s)", packed, gemms, dtype)
    logger.info("flattened %d/%d transformer layers into one function over their packed weights", flat, n_layers)
    small = dtype == "bf16" and packed == gemms and small_available()
    if small:
        for mod in stack.modules():
            if isinstance(mod, (nn.LayerNorm, nn.RMSNorm, LayerScale)):
                mod.float()
        stack.small_rows = SMALL_ROWS
        logger.info("small-row path on: inputs of <= %d rows run in fp32 on fp16-packed weights", SMALL_ROWS)
    return packed, small
