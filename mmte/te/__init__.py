"""mmte.te: TransformerEngine-shaped, single-device transformer modules.

Every module takes ``params_dtype`` and ``device`` (``"meta"`` included) and implements
``reset_parameters()``. GEMMs are :class:`Linear` instances (the FP8 and tensor-parallel hook point).
"""

from . import kernels
from .attention import ATTN_MASK_TYPES, DotProductAttention, MultiheadAttention, expand_padding_mask
from .backend import BACKENDS, TELayer, te_available
from .fusion import fuse, is_fused, unfuse
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import ACTIVATIONS, LayerNormMLP, activation_fn
from .linear import Linear
from .norm import LayerNorm, RMSNorm, make_norm
from .stack import TransformerStack, find_stacks, one_thread
from .transformer import DropPath, LayerScale, TransformerLayer

__all__ = [
    "ACTIVATIONS",
    "ATTN_MASK_TYPES",
    "BACKENDS",
    "DotProductAttention",
    "DropPath",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "LayerScale",
    "Linear",
    "MultiheadAttention",
    "RMSNorm",
    "TELayer",
    "TransformerLayer",
    "TransformerStack",
    "activation_fn",
    "expand_padding_mask",
    "find_stacks",
    "fuse",
    "is_fused",
    "kernels",
    "make_norm",
    "one_thread",
    "te_available",
    "unfuse",
]
