"""mmte.fp8: FP8 training and inference for mmte's linears, on any device.

Recipes (:mod:`~mmte.fp8.recipes`) say how scales are chosen, :mod:`~mmte.fp8.quantize` casts tensors,
:mod:`~mmte.fp8.gemm` multiplies them (hardware ``torch._scaled_mm`` or an exact emulation),
:class:`FP8Linear` runs a layer's three GEMMs in FP8 inside :func:`autocast`, and :func:`convert` swaps
a model's backbone linears. Typical use::

    model = mmte.fp8.convert(model, mmte.fp8.DelayedScaling(amax_history_len=16))
    with torch.autocast("cuda", torch.bfloat16), mmte.fp8.autocast(recipe=mmte.fp8.DelayedScaling(amax_history_len=16)):
        loss = model(batch)
    loss.backward()
"""

from .autocast import autocast, get_fp8_context, is_fp8_enabled, update_scales
from .convert import convert, default_filter, freeze_fp8_weights, weight_memory
from .formats import E4M3, E5M2, E8M0_DTYPE, Format, FP8Dtype, cast_to_fp8, get_format
from .gemm import fp8_gemm, is_available, scaled_mm_capable, select_gemm
from .linear import ROLES, FP8Linear
from .quantize import (
    QuantizedTensor,
    amax,
    mx_scale_exponent,
    quantize_blockwise,
    quantize_mx,
    quantize_tensorwise,
    scale_from_amax,
)
from .recipes import (
    MXFP8,
    RECIPES,
    BlockScaling,
    CurrentScaling,
    DelayedScaling,
    Recipe,
    delayed_scale,
    make_recipe,
    to_te_recipe,
)

__all__ = [
    "E4M3",
    "E5M2",
    "E8M0_DTYPE",
    "MXFP8",
    "RECIPES",
    "ROLES",
    "BlockScaling",
    "CurrentScaling",
    "DelayedScaling",
    "FP8Dtype",
    "FP8Linear",
    "Format",
    "QuantizedTensor",
    "Recipe",
    "amax",
    "autocast",
    "cast_to_fp8",
    "convert",
    "default_filter",
    "delayed_scale",
    "fp8_gemm",
    "freeze_fp8_weights",
    "get_format",
    "get_fp8_context",
    "is_available",
    "is_fp8_enabled",
    "make_recipe",
    "mx_scale_exponent",
    "quantize_blockwise",
    "quantize_mx",
    "quantize_tensorwise",
    "scale_from_amax",
    "scaled_mm_capable",
    "select_gemm",
    "to_te_recipe",
    "update_scales",
    "weight_memory",
]
