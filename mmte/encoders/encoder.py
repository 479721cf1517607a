"""``Encoder``: a tokenizer in front of a backbone — what a converted timm / HF model becomes."""

from __future__ import annotations

import torch
from torch import nn

from ..seq import TokenSeq
from .backbone import Backbone

__all__ = ["Encoder"]


class Encoder(nn.Module):
    """``backbone(tokenizer(inputs))``.

    ``forward_features`` returns the hidden states ``[B, N, D]`` for every token (cls included), the
    same quantity as timm's ``forward_features`` and HF's ``last_hidden_state``.
    """

    def __init__(self, tokenizer: nn.Module, backbone: Backbone):
        super().__init__()
        self.tokenizer = tokenizer
        self.backbone = backbone

    def tokenize(self, *args, **kwargs) -> TokenSeq:
        return self.tokenizer(*args, **kwargs)

    def forward_features(self, *args, **kwargs) -> torch.Tensor:
        seq = self.tokenize(*args, **kwargs)
        return self.backbone(seq.tokens, seq.mask)

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.forward_features(*args, **kwargs)

    def reset_parameters(self) -> None:
        self.tokenizer.reset_parameters()
        self.backbone.reset_parameters()
