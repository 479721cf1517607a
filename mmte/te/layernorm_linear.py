"""``LayerNormLinear``: a normalisation followed by a GEMM (the QKV projection of a pre-norm layer).

Eager mode runs the two ops one after the other; in a fused backbone the surrounding layer is compiled
and the norm is emitted as one kernel that writes the normalised activations once, straight into the
GEMM's input (TE does the same with a hand-written kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .linear import Linear
from .norm import make_norm

__all__ = ["LayerNormLinear"]


class LayerNormLinear(nn.Module):
    """``linear(norm(x))``.

    Args:
        in_features, out_features: GEMM sizes (the norm acts on ``in_features``).
        eps: norm epsilon.
        bias: GEMM bias.
        normalization: ``"LayerNorm"``, ``"RMSNorm"`` or ``None`` (no norm: a post-norm layer's QKV).
        return_layernorm_output: also return the normalised input (for residuals taken after the norm).
        zero_centered_gamma, init_method, params_dtype, device: as in :class:`~mmte.te.LayerNorm` and
            :class:`~mmte.te.Linear`.

    Submodules (stable names): ``norm``, ``linear``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        eps: float = 1e-5,
        bias: bool = True,
        *,
        normalization: str | None = "LayerNorm",
        return_layernorm_output: bool = False,
        zero_centered_gamma: bool = False,
        init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.return_layernorm_output = return_layernorm_output
        self.norm = make_norm(
            normalization, in_features, eps, zero_centered_gamma=zero_centered_gamma, params_dtype=params_dtype, device=device
        )
        self.linear = Linear(in_features, out_features, bias, init_method=init_method, params_dtype=params_dtype, device=device)

    def reset_parameters(self) -> None:
        for m in (self.norm, self.linear):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"LayerNormLinear expects inputs [..., {self.in_features}]; got shape {tuple(x.shape)}")
        h = self.norm(x)
        out = self.linear(h)
        return (out, h) if self.return_layernorm_output else out
