"""mmte: Meta-Transformer-style multimodal models on one shared, fused transformer backbone."""

from __future__ import annotations

__version__ = "0.1.0"

from . import device
from .encoders import Backbone, BackboneConfig, from_hf, from_timm, load_meta_transformer
from .tokenizers import TokenSeq

__all__ = [
    "Backbone",
    "BackboneConfig",
    "TokenSeq",
    "__version__",
    "device",
    "from_hf",
    "from_timm",
    "load_meta_transformer",
]
