"""Text tokenizer: BERT-style word + position + token-type embeddings, LayerNorm, dropout.

The vocabulary step (WordPiece/BPE via ``transformers``) lives in :mod:`mmte.data`; this module embeds
the resulting ids.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.text import TextVocab, collate_text, example_text
from .base import ModalityTokenizer, TokenSeq
from .registry import register_modality

__all__ = ["TextTokenizer"]


@register_modality(
    "text",
    preprocess=TextVocab,
    collate=collate_text,
    default_head={"name": "classification", "pool": "mean"},
    example=example_text,
    example_config={"vocab_size": 1000, "max_position_embeddings": 64},
    variable_length=True,
    description="token ids {input_ids, attention_mask} [B, N] from a Hugging Face vocabulary: word + position embeddings",
)
class TextTokenizer(ModalityTokenizer):
    """Token ids ``[B, N]`` -> embeddings ``[B, N, D]`` with the padding mask.

    Args:
        dim: token width.
        vocab_size: vocabulary size.
        max_position_embeddings: longest sequence.
        type_vocab_size: segment types (0 disables token-type embeddings).
        pad_token_id: id used for padding (its embedding row is zero-initialised).
        layernorm_eps: epsilon of the embedding LayerNorm (None: no norm, as CLIP's text tower).
        dropout: embedding dropout.
    """

    modality = "text"

    def __init__(
        self,
        dim: int,
        vocab_size: int = 30522,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        pad_token_id: int = 0,
        layernorm_eps: float | None = 1e-12,
        dropout: float = 0.0,
        *,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(dim)
        kw = {"device": device, "dtype": params_dtype}
        self.vocab_size, self.max_position_embeddings, self.pad_token_id = vocab_size, max_position_embeddings, pad_token_id
        self.word_embeddings = nn.Embedding(vocab_size, dim, padding_idx=pad_token_id, **kw)
        self.position_embeddings = nn.Embedding(max_position_embeddings, dim, **kw)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, dim, **kw) if type_vocab_size else None
        self.norm = nn.LayerNorm(dim, eps=layernorm_eps, **kw) if layernorm_eps is not None else None
        self.dropout = nn.Dropout(dropout)
        if self.word_embeddings.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for e in (self.word_embeddings, self.position_embeddings, self.token_type_embeddings):
            if e is not None:
                nn.init.normal_(e.weight, std=0.02)
        with torch.no_grad():
            self.word_embeddings.weight[self.pad_token_id].zero_()
        if self.norm is not None:
            self.norm.reset_parameters()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> TokenSeq:
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"text tokenizer expects integer token ids [B, N]; got {input_ids.dtype} {tuple(input_ids.shape)}")
        b, n = input_ids.shape
        if n > self.max_position_embeddings:
            raise ValueError(f"sequence length {n} exceeds max_position_embeddings={self.max_position_embeddings}")
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.vocab_size}); got range [{int(input_ids.min())}, {int(input_ids.max())}]"
            )
        pos = torch.arange(n, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)[None]
        if self.token_type_embeddings is not None:
            tt = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(tt)
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (b, n):
                raise ValueError(f"attention_mask must have shape {(b, n)}; got {tuple(attention_mask.shape)}")
            mask = attention_mask.bool()
        return TokenSeq(x, mask, 0)
