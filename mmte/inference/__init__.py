"""The inference path: a trained model made ready for prediction on the machine it runs on.

:func:`optimize` (also ``MetaTransformer.inference()``) returns an :class:`InferenceModel`, a frozen
copy of the model to which conversions are applied as module swaps (as ``mmte.fp8.convert`` does):
the backbones' dtype, fixed stems kept in fp32 (:func:`keep_fp32`), and on CPUs prepacked GEMMs
(:class:`PackedLinear`) and flat layers (:class:`PackedTransformerLayer`) through :func:`pack`.
"""

from .convert import pack, prepack_stack, unpack
from .fp32 import KEPT_FP32, Fp32SpeechEmbedding, keep_fp32, release_fp32
from .layer import PackedTransformerLayer, apply_norm
from .optimize import DTYPES, InferenceModel, optimize, resolve_dtype
from .prepack import PACKABLE, SMALL_ROWS, PackedLinear, available, small_available

__all__ = [
    "DTYPES",
    "KEPT_FP32",
    "PACKABLE",
    "SMALL_ROWS",
    "Fp32SpeechEmbedding",
    "InferenceModel",
    "PackedLinear",
    "PackedTransformerLayer",
    "apply_norm",
    "available",
    "keep_fp32",
    "optimize",
    "pack",
    "prepack_stack",
    "release_fp32",
    "resolve_dtype",
    "small_available",
    "unpack",
]
