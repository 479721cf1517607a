"""The contract every modality tokenizer meets.

A tokenizer is an ``nn.Module`` that turns one modality's preprocessed tensors into a
:class:`TokenSeq`: tokens ``[B, N, D]`` for the shared backbone plus a padding mask. It owns its cls
token and position embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from ..seq import TokenSeq

__all__ = ["ModalityTokenizer", "TokenSeq", "prepend_cls"]  # TokenSeq: re-exported from mmte.seq


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

    def export_dims(self) -> dict[str, dict[int, tuple[int, int]]]:
        """The input dimensions other than the batch that vary from sample to sample (a clip's frames), as
        ``{input key: {dim: (min, max)}}``: :func:`mmte.export.export` keeps them dynamic in the exported
        graph, which then takes any size in that range. None are declared by default: an exported graph
        fixes every other dimension at the example batch's size."""
        return {}
