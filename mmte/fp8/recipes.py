"""FP8 recipes: how each GEMM operand gets its scale.

FP8 has 8 bits, so a tensor only survives the cast when it is first multiplied by a *scale* that maps
its magnitudes into the format's range (see :mod:`mmte.fp8.formats`). Recipes differ in how finely the
scale is chosen and from which data:

``DelayedScaling`` (TE's default since FP8 training began): one scale per tensor, computed from a
history of the ``amax`` (max |x|) seen in *previous* steps, so the cast needs no extra pass over the
data. After each step the newest amax is pushed into a history of ``amax_history_len`` entries and::

    amax  = max(history)            (amax_compute_algo="max")   or   history[0]   ("most_recent")
    scale = (fp8_max / amax) / 2 ** margin

An amax that is 0 (a tensor of zeros) or not finite (an overflowed step) is *not* pushed into the history
(one NaN would otherwise poison ``max(history)`` for ``amax_history_len`` steps): the old scale is kept,
the step is counted and logged once, and ``max_bad_amax_steps`` consecutive non-finite amaxes in one
tensor stop training with an error (:class:`mmte.errors.RunError`).
Values that outgrow a stale scale saturate at ``fp8_max``. ``margin`` leaves headroom (margin=1 uses
half the range). A tensor with no history yet (its first step) is scaled just in time from its own amax
(TE starts from scale 1, which loses small values such as first-step gradients to underflow).

``CurrentScaling``: one scale per tensor from this tensor's own amax, just in time (one more pass over
the data; robust to sudden changes).

``BlockScaling`` (DeepSeek-V3, TE's ``Float8BlockScaling``, MT-TransformerEngine's block recipe): one
fp32 scale per 1x128 tile of activations and gradients (128 consecutive values along the GEMM's
contraction dimension) and per 128x128 block of weights. An outlier then only coarsens its own tile.
A 128x128 weight block is square, so the same quantized weight serves the forward GEMM (contraction over
inputs) and the backward one (contraction over outputs).

``MXFP8`` (OCP Microscaling, Blackwell tensor cores): one scale per 1x32 block along the contraction
dimension, stored as E8M0 — a bare power of two, so applying it is exact (an exponent add). The
exponent is chosen so the block's amax fits: ``scale = 2^ceil(log2(amax / fp8_max))`` ("ceil", what
NVIDIA's kernels do; nothing saturates) or the OCP spec's ``2^(floor(log2(amax)) - emax_elem)``
("floor", which may saturate values up to 1.14x the max of E4M3).

Every recipe carries the element :class:`~mmte.fp8.formats.Format` (``HYBRID``: E4M3 forward, E5M2
gradients), whether token counts are padded to the multiple of 16 that FP8 GEMMs need (``pad_tokens``),
and which GEMM runs (``gemm``: ``"auto"``, ``"scaled_mm"`` = the hardware kernel, ``"emulate"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from .formats import Format, get_format

__all__ = [
    "GEMM_CHOICES",
    "MXFP8",
    "RECIPES",
    "BlockScaling",
    "CurrentScaling",
    "DelayedScaling",
    "Recipe",
    "delayed_scale",
    "make_recipe",
    "to_te_recipe",
]

GEMM_CHOICES = ("auto", "scaled_mm", "emulate")


@dataclass(frozen=True)
class Recipe:
    """Fields every recipe has.

    Attributes:
        fp8_format: :class:`Format` or its name (``"HYBRID"``, ``"E4M3"``, ``"E5M2"``).
        pad_tokens: pad the flattened token rows of each GEMM input to a multiple of 16 (and slice the
            result); with False a non-divisible token count raises ``ValueError``.
        gemm: ``"auto"`` (hardware FP8 GEMM where the device has one, else emulation), ``"scaled_mm"``
            (require the hardware path; raises where it is missing) or ``"emulate"``.
    """

    fp8_format: Format = Format.HYBRID
    pad_tokens: bool = True
    gemm: str = "auto"

    #: GEMM dimensions (tokens, in/out features) must be multiples of this (cuBLASLt FP8 rule).
    multiple: int = field(default=16, init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "fp8_format", get_format(self.fp8_format))
        if self.gemm not in GEMM_CHOICES:
            raise ValueError(f"gemm must be one of {GEMM_CHOICES}; got {self.gemm!r}")
        if not isinstance(self.pad_tokens, bool):
            raise TypeError(f"pad_tokens must be a bool; got {self.pad_tokens!r}")

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def tensorwise(self) -> bool:
        """One scale per tensor (delayed / current scaling)."""
        return True

    @property
    def needs_history(self) -> bool:
        return False


@dataclass(frozen=True)
class DelayedScaling(Recipe):
    """Per-tensor scales from an amax history of earlier steps (see the module docstring).

    Attributes:
        margin: scale down by ``2**margin`` for headroom.
        amax_history_len: steps remembered.
        amax_compute_algo: ``"max"`` of the history or its ``"most_recent"`` entry.
        reduce_amax: all-reduce (max) amaxes across the autocast's process group before each update,
            so every data-/tensor-parallel rank uses the same scales.
        max_bad_amax_steps: consecutive updates with a non-finite amax (inf/NaN) in one tensor after which
            training stops with an error; 0: never stop (the scale is kept and the steps counted anyway).
    """

    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True
    max_bad_amax_steps: int = 8

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be an int >= 1; got {self.amax_history_len!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent'; got {self.amax_compute_algo!r}")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an int >= 0; got {self.margin!r}")
        if not isinstance(self.max_bad_amax_steps, int) or isinstance(self.max_bad_amax_steps, bool) or self.max_bad_amax_steps < 0:
            raise ValueError(f"max_bad_amax_steps must be an int >= 0 (0: never stop); got {self.max_bad_amax_steps!r}")

    @property
    def needs_history(self) -> bool:
        return True


@dataclass(frozen=True)
class CurrentScaling(Recipe):
    """Per-tensor scale from the tensor's own amax, computed just in time.

    Attributes:
        margin: scale down by ``2**margin`` for headroom.
    """

    margin: int = 0

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an int >= 0; got {self.margin!r}")


@dataclass(frozen=True)
class BlockScaling(Recipe):
    """fp32 scales per 1 x ``tile`` activation/gradient tile and ``block`` x ``block`` weight block.

    Attributes:
        tile: activation/gradient tile length along the contraction dimension (128).
        block: weight block edge (128).
        power_2_scale: round each scale down to a power of two (exact dequantization, as TE's option).
    """

    tile: int = 128
    block: int = 128
    power_2_scale: bool = False

    def __post_init__(self):
        super().__post_init__()
        for n in ("tile", "block"):
            v = getattr(self, n)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"BlockScaling.{n} must be a positive int; got {v!r}")

    @property
    def tensorwise(self) -> bool:
        return False


@dataclass(frozen=True)
class MXFP8(Recipe):
    """OCP MXFP8: E8M0 (power-of-two) scales per 1 x ``block_size`` block along the contraction dim.

    Attributes:
        block_size: elements sharing one scale (32 in the OCP spec).
        scale_rounding: ``"ceil"`` (no value saturates; NVIDIA's choice) or ``"floor"`` (OCP spec).
    """

    block_size: int = 32
    scale_rounding: str = "ceil"

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"MXFP8.block_size must be a positive int; got {self.block_size!r}")
        if self.scale_rounding not in ("ceil", "floor"):
            raise ValueError(f"MXFP8.scale_rounding must be 'ceil' or 'floor'; got {self.scale_rounding!r}")

    @property
    def tensorwise(self) -> bool:
        return False


RECIPES: dict[str, type[Recipe]] = {
    "delayed": DelayedScaling,
    "current": CurrentScaling,
    "block": BlockScaling,
    "mx": MXFP8,
    "mxfp8": MXFP8,
}


def make_recipe(name: str | Recipe, **kwargs) -> Recipe:
    """A recipe from its short name (``"delayed"``, ``"current"``, ``"block"``, ``"mx"``) and fields.

    Fields the recipe does not have raise ``ValueError`` naming them.
    """
    if isinstance(name, Recipe):
        return name
    if not isinstance(name, str) or name.lower() not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)} or a Recipe; got {name!r}")
    cls = RECIPES[name.lower()]
    allowed = {f.name for f in fields(cls) if f.init}
    bad = sorted(set(kwargs) - allowed)
    if bad:
        raise ValueError(f"{cls.__name__} has no field(s) {bad}; expected some of {sorted(allowed)}")
    return cls(**kwargs)


def delayed_scale(
    amax_history: torch.Tensor, old_scale: torch.Tensor, fp8_max: float, margin: int = 0, algo: str = "max"
) -> torch.Tensor:
    """The delayed-scaling update: ``(fp8_max / amax) / 2**margin``, keeping ``old_scale`` when amax is 0
    or not finite (or the new scale would not be finite).

    Args:
        amax_history: ``[..., L]``, newest first.
        old_scale: ``[...]`` current scales.
        fp8_max: the format's max (448 or 57344).
        margin: headroom exponent.
        algo: ``"max"`` or ``"most_recent"``.

    Returns:
        new scales ``[...]`` (fp32).
    """
    amax = amax_history.amax(-1) if algo == "max" else amax_history[..., 0]
    amax = amax.float()
    new = (fp8_max / amax) / math.ldexp(1.0, margin)
    ok = torch.isfinite(amax) & (amax > 0) & torch.isfinite(new)
    return torch.where(ok, new, old_scale.float())


def to_te_recipe(recipe: Recipe):
    """The equivalent ``transformer_engine.common.recipe`` object (backend ``"te"``; needs TE installed)."""
    from ..te.backend import te_available

    ok, why = te_available()
    if not ok:
        raise RuntimeError(f"to_te_recipe needs TransformerEngine: {why}")
    from transformer_engine.common import recipe as te_recipe  # pragma: no cover - needs CUDA + TE

    fmt = getattr(te_recipe.Format, recipe.fp8_format.value)  # pragma: no cover
    if isinstance(recipe, DelayedScaling):  # pragma: no cover
        return te_recipe.DelayedScaling(
            margin=recipe.margin, fp8_format=fmt, amax_history_len=recipe.amax_history_len,
            amax_compute_algo=recipe.amax_compute_algo,
        )
    if isinstance(recipe, CurrentScaling):  # pragma: no cover
        return te_recipe.Float8CurrentScaling(fp8_format=fmt)
    if isinstance(recipe, BlockScaling):  # pragma: no cover
        return te_recipe.Float8BlockScaling(fp8_format=fmt)
    if isinstance(recipe, MXFP8):  # pragma: no cover
        return te_recipe.MXFP8BlockScaling(fp8_format=fmt)
    raise TypeError(f"no TransformerEngine recipe for {recipe!r}")  # pragma: no cover
