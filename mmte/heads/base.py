"""Head base class and masked pooling shared by the heads."""

from __future__ import annotations

import torch
from torch import nn

from ..seq import TokenSeq

__all__ = ["POOLINGS", "Head", "masked_pool"]

POOLINGS = ("cls", "mean", "max")


def masked_pool(hidden: torch.Tensor, mask: torch.Tensor | None, pool: str, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Pool ``[B, N, D]`` hidden states to ``[B, D]``, ignoring padding.

    Args:
        hidden: ``[B, N, D]``.
        mask: bool ``[B, N]`` (True = real token) or None (all real).
        pool: ``"cls"`` (the first token), ``"mean"`` or ``"max"`` over the real tokens after the
            ``num_prefix_tokens`` leading special tokens (all real tokens when there are no others).
        num_prefix_tokens: leading cls/register tokens excluded from mean/max pooling.

    Returns:
        ``[B, D]``.
    """
    if hidden.dim() != 3:
        raise ValueError(f"pooling expects hidden states [B, N, D]; got shape {tuple(hidden.shape)}")
    if pool == "cls":
        return hidden[:, 0]
    if pool not in POOLINGS:
        raise ValueError(f"pool must be one of {POOLINGS}; got {pool!r}")
    n = hidden.shape[1]
    if n == 0:
        raise ValueError(f"pooling needs at least one token; got hidden states of shape {tuple(hidden.shape)}")
    if mask is None:  # every token real: a plain reduction over the tokens after the prefix (all when none are others)
        h = hidden[:, num_prefix_tokens:] if 0 < num_prefix_tokens < n else hidden
        return h.mean(1) if pool == "mean" else h.amax(1)
    m = mask
    if 0 < num_prefix_tokens < n:
        m = m.clone()
        m[:, :num_prefix_tokens] = False
    if not torch.compiler.is_exporting() and not bool(m.any(1).all()):  # exported graphs: no data-dependent check
        raise ValueError("every sample needs at least one real (unmasked) token to pool; got a fully padded sample")
    if pool == "mean":
        w = m.to(hidden.dtype).unsqueeze(-1)
        return (hidden * w).sum(1) / w.sum(1)
    return hidden.masked_fill(~m.unsqueeze(-1), float("-inf")).amax(1)


class Head(nn.Module):
    """Base class of heads.

    A head maps the backbone's hidden states to predictions and owns its loss. Single-input heads are
    called as ``head(hidden [B, N, D], seq: TokenSeq)``; heads with ``multi_input = True`` (contrastive)
    as ``head({modality: (hidden, seq)})``.

    Attributes:
        inputs: the modalities (batch keys) the head reads; set by :class:`mmte.model.MetaTransformer`.
        target: the batch key holding its target (None when it needs none).
        multi_input: whether the head reads several separately-encoded modalities.
        task: ``"classification"``, ``"regression"``, ``"forecasting"``, ``"token"``, ``"contrastive"`` or None:
            which metrics the trainer logs and which options the data fills in (a subclass of a built-in head
            inherits its task).
    """

    multi_input: bool = False
    default_target: str | None = "label"
    #: the built-in task whose metrics and data-filled options (``num_classes``...) apply; subclasses inherit it
    task: str | None = None

    def __init__(self, dim: int):
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"head dim must be a positive int; got {dim!r}")
        self.dim = dim
        self.inputs: list[str] = []
        self.target: str | None = self.default_target

    def reset_parameters(self) -> None:
        for m in self.children():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def loss(self, output, target: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover - subclasses
        raise NotImplementedError

    @staticmethod
    def _check_hidden(hidden: torch.Tensor, seq: TokenSeq | None, dim: int) -> None:
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[-1] != dim:
            raise ValueError(f"head expects hidden states [B, N, {dim}]; got {getattr(hidden, 'shape', type(hidden))}")
