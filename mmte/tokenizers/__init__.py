"""mmte.tokenizers: modality tokenizers (data -> TokenSeq)."""

from .base import ModalityTokenizer, TokenSeq
from .image import ImageTokenizer, resample_pos_embed
from .text import TextTokenizer

__all__ = ["ImageTokenizer", "ModalityTokenizer", "TextTokenizer", "TokenSeq", "resample_pos_embed"]
