"""Hand-written Triton kernels for the memory-bound parts of a transformer layer.

Between the GEMMs of a transformer layer everything is memory bound: the time is the bytes moved, not
the arithmetic. Run op by op, the residual add and the norm that follows it read and write the hidden
state several times (``h = x + r`` writes ``h``; ``layer_norm(h)`` reads it again, and its backward
reads ``h``, ``dy`` and the saved statistics in separate passes). The kernels do each such chain in
one pass:

* :func:`fused_add_layer_norm` / :func:`fused_add_rms_norm` -- ``h = x + residual`` and
  ``y = norm(h) * gamma (+ beta)`` in one kernel: it reads ``x`` and ``residual`` once and writes ``y``
  and ``h`` once, plus the per-row statistics for the backward, which is one kernel too (``dx`` is
  also the residual's gradient, as for ``x + residual``).
* :func:`bias_activation` (and :func:`bias_gelu`, :func:`bias_quick_gelu`, :func:`bias_silu`,
  :func:`bias_relu`): ``act(x + bias)`` in one pass forward and one backward.

All arithmetic is in fp32 whatever the storage dtype (fp32, fp16, bf16); intermediates the torch
composition rounds to the storage dtype are rounded the same way, so results match it up to fp32
reassociation. ``x`` and ``residual`` may differ in dtype (a bf16 branch into an fp32 residual stream
under autocast): the sum and the normalised output take the promoted dtype, as ``x + residual`` would.

The kernels are ``torch.library`` operators (``torch.ops.mmte.add_norm``, ``torch.ops.mmte.bias_act``
and their backwards; :mod:`mmte.te.kernels.ops`), so ``torch.compile`` and ``torch.export`` trace them
as single ops. Dispatch (``impl="auto"``): the Triton kernel runs when triton imports and the tensor is
on a CUDA device, or on a CPU tensor when ``TRITON_INTERPRET=1`` is set (Triton's interpreter, for
tests; its fp8 casts are not the hardware's), and a norm's row fits one tile (``hidden <= MAX_HIDDEN``).
Otherwise -- and inside ``torch.compile`` regions, where inductor fuses the composition itself -- the
exact torch composition runs. ``MMTE_DISABLE_TRITON=1`` forces the composition. :func:`available` says
which applies and why.

Importing this package does not import triton (:mod:`mmte.te.kernels.jit`, which holds the kernels, is
imported on first launch). Triton reads ``TRITON_INTERPRET`` once, when it is imported, so the
interpreter needs the variable set before anything in the process imports triton (torch.compile
does); :func:`available` reports a late one.

In a model, the kernels run through a module swap: :func:`use_kernels` (what
``Backbone(fused=True, fusion="kernels")`` applies) turns each eligible layer into a
:class:`KernelTransformerLayer`.
"""

from ._dispatch import MAX_HIDDEN, act_tiles, available, dispatches_to_triton, interpreter_mode, norm_tiles
from .layer import KernelTransformerLayer, kernels_apply, use_kernels
from .ops import (
    ACTIVATIONS,
    bias_activation,
    bias_gelu,
    bias_quick_gelu,
    bias_relu,
    bias_silu,
    fused_add_layer_norm,
    fused_add_rms_norm,
)

__all__ = [
    "ACTIVATIONS",
    "MAX_HIDDEN",
    "KernelTransformerLayer",
    "act_tiles",
    "available",
    "bias_activation",
    "bias_gelu",
    "bias_quick_gelu",
    "bias_relu",
    "bias_silu",
    "dispatches_to_triton",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
    "interpreter_mode",
    "kernels_apply",
    "norm_tiles",
    "use_kernels",
]
