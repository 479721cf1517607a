"""Token sequences: the one data type every layer above the engine shares.

A tokenizer returns a :class:`TokenSeq`, the backbone reads its tokens and mask, and heads pool it; it
lives at the bottom of the package so that tokenizers, encoders, heads and the model all import it from
here without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

__all__ = ["TokenSeq"]


@dataclass
class TokenSeq:
    """A batch of token sequences.

    Attributes:
        tokens: float ``[B, N, D]``.
        mask: bool ``[B, N]`` (True = real token) or None when every token is real.
        num_prefix_tokens: leading special tokens (cls / register tokens) that poolers may use.
        positions: optional per-token positions (e.g. point-cloud centres ``[B, N, 3]``).
        extras: anything else a head may need (e.g. instance-norm statistics for forecasting).
    """

    tokens: torch.Tensor
    mask: torch.Tensor | None = None
    num_prefix_tokens: int = 0
    positions: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        t = self.tokens
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"TokenSeq.tokens must be a [B, N, D] tensor; got {getattr(t, 'shape', type(t))}")
        if self.mask is not None and (self.mask.dtype != torch.bool or tuple(self.mask.shape) != tuple(t.shape[:2])):
            raise ValueError(
                f"TokenSeq.mask must be bool [B, N] = {tuple(t.shape[:2])}; got {self.mask.dtype} {tuple(self.mask.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def dim(self) -> int:
        return self.tokens.shape[2]

    def full_mask(self) -> torch.Tensor:
        """The mask, or all-True when there is none."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.tokens.shape[:2], dtype=torch.bool, device=self.tokens.device)

    def replace(self, **changes) -> TokenSeq:
        return replace(self, **changes)
