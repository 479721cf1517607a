"""ECG beat-shape classification: a new modality (file reader, preprocessing, tokenizer) and a new head.

Importing this module registers the modality ``ecg`` and the head ``attention_pool``; see docs/extending.md.
"""

import numpy as np
import torch
from torch import nn

from mmte.heads import ClassificationHead, register_head
from mmte.tokenizers import ModalityTokenizer, TokenSeq, register_modality


def read_ecg(path: str, length: int = 1000) -> torch.Tensor:
    """One ECG lead (a .npy array or a one-column .csv) -> float32 [length], zero-padded, standardised."""
    x = np.load(path) if str(path).endswith(".npy") else np.loadtxt(path, delimiter=",")
    x = torch.as_tensor(x, dtype=torch.float32).flatten()[:length]
    x = nn.functional.pad(x, (0, length - x.numel()))
    return (x - x.mean()) / (x.std() + 1e-6)


def example_ecg(size: int, seed: int) -> torch.Tensor:
    """A random preprocessed sample (mmte's registry tests call it)."""
    return torch.randn(1000, generator=torch.Generator().manual_seed(seed))


@register_modality("ecg", preprocess=read_ecg, example=example_ecg, default_head={"name": "attention_pool"})
class ECGTokenizer(ModalityTokenizer):
    """Single-lead ECG [B, L] -> one token per ``patch`` samples, plus learned positions."""

    def __init__(self, dim: int, patch: int = 50, length: int = 1000):
        super().__init__(dim)
        self.patch = patch
        self.proj = nn.Linear(patch, dim)
        self.pos = nn.Parameter(torch.zeros(1, length // patch, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.proj.reset_parameters()
        nn.init.trunc_normal_(self.pos, std=0.02)

    def forward(self, ecg: torch.Tensor) -> TokenSeq:
        b, n = ecg.shape
        x = self.proj(ecg[:, : n // self.patch * self.patch].reshape(b, -1, self.patch))
        return TokenSeq(x + self.pos[:, : x.shape[1]])


@register_head("attention_pool")
class AttentionPoolHead(ClassificationHead):
    """Classification over a learned softmax-weighted average of the tokens (padding excluded)."""

    def __init__(self, dim: int, num_classes: int, **kwargs):
        super().__init__(dim, num_classes, **kwargs)
        self.score = nn.Linear(dim, 1, bias=False)  # a bias would shift every score alike: no softmax weight changes

    def forward(self, hidden: torch.Tensor, seq: TokenSeq | None = None) -> torch.Tensor:
        s = self.score(hidden).squeeze(-1)
        if seq is not None and seq.mask is not None:
            s = s.masked_fill(~seq.mask, float("-inf"))
        return self.mlp((s.softmax(-1).unsqueeze(-1) * hidden).sum(1))
