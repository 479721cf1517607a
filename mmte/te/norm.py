"""Normalisation layers with TransformerEngine's argument names (``hidden_size``, ``eps``,
``params_dtype``, ``device``, ``zero_centered_gamma``).

They subclass ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` so that everything in PyTorch that knows
those classes (``SequenceParallel``, FSDP2, torch.compile's norm fusions) keeps working.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .lowp import LOW_PRECISION, cast_param

__all__ = ["LayerNorm", "RMSNorm", "make_norm"]


class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dimension.

    Args:
        hidden_size: size of the normalised (last) dimension.
        eps: added to the variance.
        bias: whether to learn an additive bias.
        zero_centered_gamma: store ``gamma - 1`` (initialised to 0) instead of ``gamma``, as TE does
            for better low-precision behaviour; the output is the same.
        params_dtype, device: where and in which dtype the parameters are created (``"meta"`` too).
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        *,
        bias: bool = True,
        zero_centered_gamma: bool = False,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        self.zero_centered_gamma = zero_centered_gamma
        super().__init__(hidden_size, eps=eps, elementwise_affine=True, bias=bias, device=device, dtype=params_dtype)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight) if self.zero_centered_gamma else nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + 1 if self.zero_centered_gamma else self.weight
        b = self.bias
        if x.dtype != w.dtype and x.dtype in LOW_PRECISION and x.device.type != "cpu":
            # the CPU kernel takes fp32 gamma/beta with bf16 inputs as they are; elsewhere match the input
            w, b = w.to(x.dtype), cast_param(b, x.dtype) if b is not None else None
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


class RMSNorm(nn.RMSNorm):
    """RMSNorm over the last dimension (``x / rms(x) * gamma``); same arguments as :class:`LayerNorm`."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        *,
        zero_centered_gamma: bool = False,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        self.zero_centered_gamma = zero_centered_gamma
        super().__init__(hidden_size, eps=eps, elementwise_affine=True, device=device, dtype=params_dtype)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight) if self.zero_centered_gamma else nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight + 1 if self.zero_centered_gamma else self.weight
        if x.dtype != w.dtype and x.dtype in LOW_PRECISION:  # no mixed-dtype RMSNorm kernel: match the input
            w = cast_param(w, x.dtype) if not self.zero_centered_gamma else w.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, w, self.eps)


def make_norm(
    normalization: str | None,
    hidden_size: int,
    eps: float,
    *,
    zero_centered_gamma: bool = False,
    params_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """Build ``"LayerNorm"``, ``"RMSNorm"`` or (``None``) an ``nn.Identity``."""
    if normalization is None:
        return nn.Identity()
    kw = {"zero_centered_gamma": zero_centered_gamma, "params_dtype": params_dtype, "device": device}
    if normalization == "LayerNorm":
        return LayerNorm(hidden_size, eps, **kw)
    if normalization == "RMSNorm":
        return RMSNorm(hidden_size, eps, **kw)
    raise ValueError(f"normalization must be 'LayerNorm', 'RMSNorm' or None; got {normalization!r}")

