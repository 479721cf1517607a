"""Prepacked CPU GEMMs: :class:`PackedLinear`, a :class:`~mmte.te.Linear` whose weight is reordered once
into oneDNN's blocked layout for inference.

A plain ``F.linear`` on a CPU hands oneDNN (bf16) or MKL (fp32) the weight in PyTorch's row-major
layout, and the library reorders it into its blocked layout on every call; for few rows that reorder
costs as much as the GEMM. A :class:`PackedLinear` reorders its frozen weight once
(``torch.ops.mkldnn._reorder_linear_weight``, the op ``torch.compile`` uses for frozen CPU graphs) and
runs ``torch.ops.mkldnn._linear_pointwise`` on it, with the same result up to the GEMM's summation order.

The packing is used only where it is valid: CPU inputs in the weight's dtype, no autograd, not while
compiling, and only while the weight is unchanged since packing (its storage address and version counter
are checked on every call, as the bf16 weight cache of :mod:`mmte.te.lowp` does; ``load_state_dict``,
``.to()`` or an in-place edit fall back to ``F.linear`` and repack on the next call). Elsewhere the module
is its base class. Copies and pickles carry the wish to be packed, not the packed tensor.

**Small row counts** (at most :data:`SMALL_ROWS` rows of batch x tokens: one item of a few tokens) are a
matrix-vector product, bound by reading the weight. For fp32 inputs on low-precision weights the GEMMs
then run on fbgemm's fp16-weight kernel (``torch.fbgemm_linear_fp16_weight_fp32_activation``: weights
packed once in fp16, activations and accumulation in fp32), which reads two bytes a weight faster than
oneDNN's bf16 kernel at this size and is more exact (a bf16 weight is exactly an fp16 number unless below
2^-14 in magnitude). PyTorch marks these fbgemm ops deprecated; where they are missing
(:func:`small_available`) the path is not taken.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import nn

from ..te.linear import Linear
from ..te.lowp import identity

__all__ = ["PACKABLE", "SMALL_ROWS", "PackedLinear", "available", "global_hooks", "packed_gemm", "packed_gemms", "small_available", "small_gemm"]

PACKABLE = (torch.float32, torch.bfloat16)
SMALL_ROWS = 4
_ATTR = "_mmte_prepack"  # the PackedLinear's packing state


@functools.cache
def small_available() -> bool:
    """Whether fbgemm's fp16-weight GEMM runs here (the small-row path of this module).

    Every use of the path asks this first, and this probe runs both fbgemm ops once: PyTorch's deprecation
    notice for them is issued once per process, so it is silenced here and nowhere else."""
    pack_fn = getattr(torch, "fbgemm_pack_gemm_matrix_fp16", None)
    run_fn = getattr(torch, "fbgemm_linear_fp16_weight_fp32_activation", None)
    if pack_fn is None or run_fn is None or not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            y = run_fn(torch.tensor([[1.0, 1.0]]), pack_fn(torch.tensor([[1.0, 2.0], [3.0, -4.0]])), torch.zeros(2))
        return bool(torch.equal(y, torch.tensor([[3.0, -1.0]])))
    except (RuntimeError, AttributeError):
        return False


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


def _stamp(t: torch.Tensor) -> tuple:
    """Storage address, shape and version counter of ``t`` (-1 for an inference tensor, which has none)."""
    return t.data_ptr(), t.shape, -1 if t.is_inference() else t._version


class _Packed:
    """A module's packed weight (and, for the small-row path, its fp16 packing with an fp32 bias), each
    with the identity of the tensors it was made from; copies start empty."""

    def __init__(self, rows: int):
        self.rows = rows
        self.key: tuple | None = None
        self.weight: torch.Tensor | None = None
        self.source: torch.Tensor | None = None  # keeps the packed weight's storage from being reused
        self.small_key: tuple | None = None
        self.small: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (fp16 packing, fp32 bias)
        self.small_source: tuple | None = None
        self.small_seen: tuple | None = None

    def packed(self, w: torch.Tensor) -> torch.Tensor:
        key = identity(w)
        if self.key != key:
            with torch.inference_mode(False), torch.no_grad():
                self.source = w.detach()
                self.weight = torch.ops.mkldnn._reorder_linear_weight(self.source, self.rows)
            self.key = key
        return self.weight

    def small_packed(self, w: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        seen = self.small_seen  # the same tensor objects, unchanged: skip building the full key (a per-call cost here)
        if seen is not None and seen[0] is w and seen[1] is b and seen[2] == _stamp(w) and (b is None or seen[3] == _stamp(b)):
            return self.small
        key = (identity(w), None if b is None else identity(b))
        if self.small_key != key:
            with torch.inference_mode(False), torch.no_grad():
                self.small_source = (w.detach(), None if b is None else b.detach())
                bias = None if b is None else b.detach().float()
                self.small = (torch.fbgemm_pack_gemm_matrix_fp16(w.detach().float()), bias)
            self.small_key = key
        self.small_seen = (w, b, _stamp(w), None if b is None else _stamp(b))
        return self.small

    def __deepcopy__(self, memo) -> _Packed:
        return _Packed(self.rows)

    def __getstate__(self) -> dict:
        return {"rows": self.rows}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["rows"])


def packed_gemms(mods: tuple[nn.Module, ...], x: torch.Tensor, *, in_call: bool = False) -> tuple[list, list, bool] | None:
    """The packed weights and biases of the GEMM modules ``mods`` for input ``x``, and whether they are
    the small-row path's (fp32 ``x`` on low-precision weights: fp16 packings, fp32 biases); packed first,
    or again where a weight changed since. None where no packed path applies to every one of them (not
    packed, carrying forward hooks such as a LoRA adapter's, autograd on, compiling, ``x`` not on the CPU
    or in another dtype, fbgemm missing). ``in_call``: the caller is the module's own forward (inside its
    call, whose hooks run anyway), not a function that runs the GEMMs in place of the modules."""
    if torch.is_grad_enabled() or x.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    if not in_call and global_hooks():
        return None
    ws, bs, small = [], [], None
    for m in mods:
        p = m.__dict__.get(_ATTR)  # first: a module without one may not even have .weight
        if p is None or (not in_call and (m._forward_hooks or m._forward_pre_hooks)):
            return None  # not packed, or a hooked GEMM (a LoRA adapter's, a user's): it runs through its module call
        params = m._parameters  # the dict itself: nn.Module's attribute fallback is a measurable cost at batch 1
        w, b = params.get("weight"), params.get("bias")
        if w is None or w.requires_grad:  # None: e.g. a parametrized weight, computed on access
            return None
        if small is None:
            small = x.dtype == torch.float32 and w.dtype != torch.float32
            if small and not small_available():
                return None
        if small:
            if w.dtype == torch.float32:
                return None
            w, b = p.small_packed(w, b)
        elif x.dtype != w.dtype or (b is not None and b.dtype != w.dtype):
            return None
        else:
            w = p.packed(w)
        ws.append(w)
        bs.append(b)
    return ws, bs, small


def global_hooks() -> bool:
    """Whether module forward hooks are registered globally (``register_module_forward_hook``): then every
    GEMM runs through its module call, as those hooks expect."""
    m = nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks)


def small_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [rows, in] (fp32) -> [rows, out]`` on a small-row packing and its fp32 bias (:func:`packed_gemms`)."""
    return torch.fbgemm_linear_fp16_weight_fp32_activation(x.contiguous(), weight, bias)


def packed_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, small: bool, post: tuple[str, str] | None = None) -> torch.Tensor:
    """``x [rows, in] -> [rows, out]`` on a packing from :func:`packed_gemms`; ``post`` (oneDNN's
    ``(attr, algorithm)``, e.g. ``("gelu", "none")``) fuses an activation on the oneDNN path."""
    if small:
        return small_gemm(x, weight, bias)
    attr, algorithm = post or ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, attr, [], algorithm)


class PackedLinear(Linear):
    """A frozen :class:`~mmte.te.Linear` that runs inference GEMMs on CPUs from a prepacked weight.

    Made from a ``Linear`` in place by :func:`mmte.inference.pack` (the class is swapped; parameters,
    hooks and FQNs stay); where the packing does not apply (autograd on, another dtype or device,
    compiling, a parametrized weight) it runs as its base class.
    """

    lowp_cast = True  # other input dtypes take Linear's bf16 path: a Backbone under autocast may cast to bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in] -> [..., out]``."""
        got = packed_gemms((self,), x, in_call=True)
        if got is None:
            return super().forward(x)
        (w,), (b,), small = got
        shape = x.shape
        y = packed_gemm(x.reshape(-1, shape[-1]), w, b, small)
        return y.view(*shape[:-1], y.shape[-1])
