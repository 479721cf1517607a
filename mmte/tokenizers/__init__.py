"""mmte.tokenizers: modality tokenizers (data -> TokenSeq) and the modality registry.

>>> from mmte import tokenizers
>>> tok = tokenizers.create("audio", dim=768)
>>> tokenizers.list_modalities()[:3]
['audio', 'graph', 'hyperspectral']
"""

from .base import ModalityTokenizer, TokenSeq
from .image import ImageTokenizer, resample_pos_embed
from .registry import ModalitySpec, create, get_modality, list_modalities, register_modality, reload
from .text import TextTokenizer

__all__ = [
    "ImageTokenizer",
    "ModalitySpec",
    "ModalityTokenizer",
    "TextTokenizer",
    "TokenSeq",
    "create",
    "get_modality",
    "list_modalities",
    "register_modality",
    "reload",
    "resample_pos_embed",
]
