"""mmte: Meta-Transformer-style multimodal models on one shared, fused transformer backbone.

The public API is re-exported here; names from heavier sub-packages load lazily on first use.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from . import device
from .encoders import Backbone, BackboneConfig, from_hf, from_timm, load_meta_transformer
from .tokenizers import TokenSeq

# name -> module that defines it (imported on first access)
_LAZY = {
    "MetaTransformer": "mmte.model",
    "create_model": "mmte.model",
    "list_modalities": "mmte.tokenizers.registry",
    "register_modality": "mmte.tokenizers.registry",
    "get_modality": "mmte.tokenizers.registry",
    "MMTEModule": "mmte.training.module",
}

__all__ = [
    "Backbone",
    "BackboneConfig",
    "MMTEModule",
    "MetaTransformer",
    "TokenSeq",
    "__version__",
    "create_model",
    "device",
    "from_hf",
    "from_timm",
    "get_modality",
    "list_modalities",
    "load_meta_transformer",
    "register_modality",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmte' has no attribute {name!r}")
