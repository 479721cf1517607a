"""Low-precision (bf16) execution of the fused modules on fp32 master weights.

The bf16 path of a :class:`~mmte.encoders.Backbone` runs its activations in bfloat16 and keeps the
parameters wherever they are (fp32 for training: the optimiser updates fp32 master weights). Each
GEMM module asks :func:`cast_param` for its weight in the activations' dtype:

* a **trainable** parameter (``requires_grad`` and grad mode on) is cast on every call, through
  autograd, so its gradient arrives in fp32 on the master weight (as ``torch.autocast`` does);
* a **frozen** parameter is cast once and the bf16 copy is cached on the parameter object. The cache
  is keyed by the parameter's storage pointer, its version counter (every in-place update, such as
  ``load_state_dict``'s ``copy_`` or an optimiser step, bumps it), its dtype and device, so
  ``load_state_dict``, ``.to()`` and in-place edits invalidate it; a parameter whose ``requires_grad``
  is switched back on is cast per call again. Tensor subclasses (DTensor shards, FP8 weights) are
  never cached.

Reductions stay in fp32 where precision needs it: LayerNorm on bf16 inputs computes its statistics
in fp32 inside PyTorch's CPU kernel (and takes fp32 gamma/beta as they are), SDPA's flash kernel
accumulates the softmax in fp32, and the heads and the loss run on the backbone's output cast back
to the input dtype.
"""

from __future__ import annotations

import torch

__all__ = ["LOW_PRECISION", "cast_param", "clear_cache", "identity"]

LOW_PRECISION = (torch.bfloat16, torch.float16)
_ATTR = "_mmte_lowp_cache"


def identity(t: torch.Tensor) -> tuple:
    """What says a cached derivative of ``t`` is still valid: its dtype, device, storage address, shape
    and version counter (bumped by every in-place change: ``load_state_dict``'s ``copy_``, an optimiser
    step). An inference tensor (made under ``torch.inference_mode``, e.g. weights loaded while
    predicting) has no version counter; it cannot be changed in place outside inference mode, so its
    address identifies it. Whoever caches on this key keeps ``t``'s storage referenced, so that a new
    tensor at the same address with version 0 cannot match it."""
    return (t.dtype, t.device, t.data_ptr(), tuple(t.shape), -1 if t.is_inference() else t._version)


def cast_param(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``p`` in ``dtype``: cast through autograd when it trains, else from a cached copy.

    Args:
        p: a parameter (or buffer), usually fp32.
        dtype: the activations' dtype.

    Returns:
        ``p`` itself when it already has ``dtype``; otherwise a ``dtype`` tensor of the same shape.
    """
    if p.dtype == dtype:
        return p
    if (p.requires_grad and torch.is_grad_enabled()) or type(p.data) is not torch.Tensor or torch.compiler.is_compiling():
        return p.to(dtype)
    key = (dtype, identity(p))
    hit = getattr(p, _ATTR, None)
    if hit is not None and hit[0] == key:
        return hit[1]
    # Built outside inference mode so that a copy made during prediction can later be saved for a
    # backward pass (inference tensors cannot).
    # keeping p's old storage referenced (the detached view) stops its address from being reused by
    # a new tensor with version 0, which would otherwise hit this key
    with torch.inference_mode(False), torch.no_grad():
        low, keep = p.detach().to(dtype), p.detach()
    setattr(p, _ATTR, (key, low, keep))
    return low


def clear_cache(module: torch.nn.Module) -> int:
    """Drop the cached low-precision copies of ``module``'s parameters; returns how many were dropped."""
    n = 0
    for p in module.parameters():
        if getattr(p, _ATTR, None) is not None:
            delattr(p, _ATTR)
            n += 1
    return n
