"""Text preprocessing: a Hugging Face vocabulary (WordPiece / BPE) loaded from local files -> ids.

In mmte the *tokenizer* is the learned embedding module; the vocabulary step here turns strings into
integer ids ``[N]`` and the collate pads them into ``{"input_ids": [B, N], "attention_mask": [B, N]}``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from .collate import pad_stack

__all__ = ["TextVocab", "collate_text", "example_text"]


class TextVocab:
    """A Hugging Face tokenizer read from a local directory (``tokenizer.json`` / ``vocab.txt`` ...).

    Args:
        path: directory with the vocabulary files (nothing is downloaded).
        max_length: truncate to this many ids (special tokens included).
    """

    def __init__(self, path: str | os.PathLike, max_length: int = 512):
        if not os.path.isdir(path):
            raise ValueError(f"text vocabulary path must be a local directory with tokenizer files; got {os.fspath(path)!r}")
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
        self.max_length = max_length
        self.pad_token_id = self.hf.pad_token_id if self.hf.pad_token_id is not None else 0
        self.vocab_size = len(self.hf)

    def __call__(self, text: str) -> torch.Tensor:
        """Encode one string (with the vocabulary's special tokens, e.g. [CLS] ... [SEP]) -> ids ``[N]``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        ids = self.hf(text, truncation=True, max_length=self.max_length)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)


def collate_text(samples: Sequence[torch.Tensor], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad id sequences ``[N_i]`` -> ``{"input_ids": [B, N], "attention_mask": bool [B, N]}``."""
    for i, s in enumerate(samples):
        if not isinstance(s, torch.Tensor) or s.dim() != 1 or s.is_floating_point():
            raise ValueError(f"text sample {i} must be integer ids [N]; got {getattr(s, 'dtype', type(s))} {tuple(getattr(s, 'shape', ()))}")
    ids, lengths = pad_stack(samples, 0, pad_token_id)
    mask = torch.arange(ids.shape[1])[None] < lengths[:, None]
    return {"input_ids": ids, "attention_mask": mask}


_WORDS = [
    "the", "transformer", "reads", "every", "modality", "as", "a", "sequence", "of", "tokens", "and", "one",
    "shared", "encoder", "turns", "them", "into", "features", "that", "small", "heads", "map", "to",
    "labels", "while", "the", "encoder", "itself", "stays", "frozen", "during", "training",
]


def example_text(size: int, seed: int, vocab_size: int = 1000) -> torch.Tensor:
    """Ids of a sentence of 8 (size 0) or 24 (size 1) words, hashed into ``[1, vocab_size)``."""
    g = torch.Generator().manual_seed(seed)
    n = (8, 24)[size]
    idx = torch.randint(0, len(_WORDS), (n,), generator=g)
    return torch.tensor([1 + (sum(map(ord, _WORDS[i])) * 7919) % (vocab_size - 1) for i in idx.tolist()], dtype=torch.long)
