"""The contract every modality tokenizer meets.

A tokenizer is an ``nn.Module`` that turns one modality's preprocessed tensors into a
:class:`TokenSeq`: tokens ``[B, N, D]`` for the shared backbone plus a padding mask. It owns its cls
token and position embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

__all__ = ["ModalityTokenizer", "TokenSeq", "prepend_cls"]


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


def prepend_cls(
    cls_token: torch.Tensor | None, tokens: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prepend a learned ``[1, 1, D]`` cls token to ``tokens [B, N, D]`` and a True column to ``mask``.

    A ``cls_token`` of None returns the inputs unchanged.
    """
    if cls_token is None:
        return tokens, mask
    b = tokens.shape[0]
    tokens = torch.cat([cls_token.expand(b, -1, -1), tokens], 1)
    if mask is not None:
        mask = torch.cat([mask.new_ones(b, 1), mask], 1)
    return tokens, mask


class ModalityTokenizer(nn.Module):
    """Base class of tokenizers: sets ``dim`` and requires ``forward(...) -> TokenSeq`` and
    ``reset_parameters()`` (so models can be built on the meta device and materialised)."""

    modality: str = ""

    def __init__(self, dim: int):
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"tokenizer dim must be a positive int; got {dim!r}")
        self.dim = dim

    def reset_parameters(self) -> None:  # pragma: no cover - subclasses implement
        raise NotImplementedError(f"{type(self).__name__} must implement reset_parameters()")
