"""CPU weight prepacking for inference: GEMM weights reordered once into oneDNN's blocked layout.

A plain ``F.linear`` on a CPU hands oneDNN (bf16) or MKL (fp32) the weight in PyTorch's row-major
layout, and the library reorders it into its blocked layout on every call. For small row counts (one
item, a few tokens) that reorder costs as much as the GEMM itself: measured on a 2-core
AVX-512-BF16 EPYC, ``[5, 384] x [384, 1536]`` took 91 us in bf16 through ``F.linear`` and 51 us from a
prepacked weight; at 197 rows (ViT-S, one image) 681 vs 601 us. :func:`pack` reorders a frozen
:class:`~mmte.te.Linear`'s weight once (``torch.ops.mkldnn._reorder_linear_weight``, the op
``torch.compile`` uses for frozen CPU graphs; in fp32 it measured 1.1-1.8x faster than ``F.linear``
also with the libraries limited to AVX2) and the module's forward then runs
``torch.ops.mkldnn._linear_pointwise`` on it, with the same result up to the GEMM's summation order.

The packed copy is used only where it is valid: CPU inputs in the weight's dtype, no autograd
(``torch.no_grad`` / ``torch.inference_mode``), not while compiling, and only while the weight is
unchanged since packing (its storage address and version counter are checked on every call, as the
bf16 weight cache of :mod:`mmte.te.lowp` does; ``load_state_dict``, ``.to()`` or an in-place edit fall
back to ``F.linear`` and repack on the next call). Copies and pickles of a module carry the wish to be
packed, not the packed tensor, which is rebuilt on first use.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from .lowp import identity

__all__ = ["PACKABLE", "available", "pack", "packed_linear", "unpack"]

PACKABLE = (torch.float32, torch.bfloat16)
_ATTR = "_mmte_prepack"


@functools.cache
def available(dtype: torch.dtype) -> bool:
    """Whether this torch build can prepack CPU GEMM weights of ``dtype`` (oneDNN present, and for bf16
    a CPU with native bf16 units: elsewhere oneDNN would emulate bf16 and run slower than fp32)."""
    if dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        try:
            return bool(ops._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return True


class _Packed:
    """The packed weight and the identity of the weight it was made from; copies start empty."""

    def __init__(self, rows: int):
        self.rows = rows
        self.key: tuple | None = None
        self.weight: torch.Tensor | None = None
        self.source: torch.Tensor | None = None  # keeps the packed weight's storage from being reused

    def __deepcopy__(self, memo) -> _Packed:
        return _Packed(self.rows)

    def __getstate__(self) -> dict:
        return {"rows": self.rows}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["rows"])


def pack(module: nn.Module, rows: int = 1) -> int:
    """Mark every :class:`~mmte.te.Linear` in ``module`` whose weight can be packed (a plain CPU tensor
    in fp32 or bf16 that :func:`available` supports, not trained) for packed inference GEMMs.

    Args:
        module: a model or any part of one.
        rows: the typical number of input rows (batch x tokens) that oneDNN tunes the layout for; any
            row count runs correctly.

    Returns:
        how many GEMM modules were marked.
    """
    from .linear import Linear

    n = 0
    for m in module.modules():
        w = getattr(m, "weight", None)
        if type(m) is not Linear or w is None or type(w.data) is not torch.Tensor:
            continue
        if w.device.type != "cpu" or w.requires_grad or not available(w.dtype):
            continue
        setattr(m, _ATTR, _Packed(max(1, int(rows))))
        n += 1
    return n


def unpack(module: nn.Module) -> int:
    """Undo :func:`pack` on ``module``; returns how many GEMM modules it unmarked."""
    n = 0
    for m in module.modules():
        if getattr(m, _ATTR, None) is not None:
            delattr(m, _ATTR)
            n += 1
    return n


def packed_linear(m: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``m(x)`` from ``m``'s packed weight, or None where the packed path does not apply (not packed,
    autograd on, another dtype or device, compiling): the caller then runs ``F.linear``."""
    p = getattr(m, _ATTR, None)
    if p is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    w, b = m.weight, m.bias
    if x.dtype != w.dtype or x.device.type != "cpu" or w.requires_grad or (b is not None and b.dtype != w.dtype):
        return None
    key = identity(w)
    if p.key != key:
        with torch.inference_mode(False), torch.no_grad():
            p.source = w.detach()
            p.weight = torch.ops.mkldnn._reorder_linear_weight(p.source, p.rows)
        p.key = key
    shape = x.shape
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]).contiguous(), p.weight, b, "none", [], "")
    return y.view(*shape[:-1], y.shape[-1])
