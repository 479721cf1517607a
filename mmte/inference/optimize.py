"""The inference path: a trained model made ready for prediction on the machine it runs on.

:func:`optimize` (also ``MetaTransformer.inference()``) returns an :class:`InferenceModel`: a copy of
the model in eval mode with every parameter frozen, its LoRA adapters folded into the weights they adapt
(:func:`mmte.lora.merge_lora`: one GEMM instead of three, no hook), whose backbones hold their weights in the
chosen dtype, called under ``torch.inference_mode``:

* ``"bf16"``: the backbones' parameters are stored in bfloat16 and their activations run in bf16
  (``Backbone.compute_dtype``; tokens are cast on the way in and the hidden states back to fp32 on the
  way out), so the GEMMs use the CPU's bf16 units with no per-call weight cast. Tokenizers and heads
  (small, and where inputs and logits need the range) stay fp32, and the deep fixed stems of
  :data:`~mmte.inference.fp32.KEPT_FP32` (the speech embedding's 20 convolutions) compute in fp32 even
  under an autocast around the copy (``mmte predict`` under ``bf16-mixed``), so predict and serve get the
  same features, those of the fp32 model (:func:`~mmte.inference.fp32.keep_fp32`; also for ``"fp8"``; its
  convolution weights are stored channels-last, oneDNN's faster layout for them).
* On CPUs the backbones are converted by :func:`mmte.inference.convert.prepack_stack`: GEMM weights
  (bf16 or fp32) prepacked once into oneDNN's blocked layout (:class:`~mmte.inference.PackedLinear`),
  which saves the per-call reorder that dominates small batches, and each layer run as one flat
  function over them (:class:`~mmte.inference.PackedTransformerLayer`). In ``"bf16"``, inputs of at
  most ``SMALL_ROWS`` rows (batch x tokens: one item of a few tokens) run in fp32 on fp16-packed
  weights instead (fbgemm's matrix-vector kernel, faster there and more exact), with the norms kept in
  fp32 for both paths, and with torch's intra-op pool at one thread for the backbone (fbgemm's kernel
  is single-threaded and the other ops are too small to split).
* ``"fp32"``: the model as trained.
* ``"fp8"``: the backbones' linears become FP8 GEMMs with FP8 weights
  (``mmte.fp8.convert(..., inference=True)``, current scaling by default); on CPUs this is an exact
  emulation: smaller weights, not faster.
* ``"auto"``: bf16 where the device has native bf16 (:func:`mmte.device.choose_precision`), else fp32.

``compile=True`` compiles the backbone layers (regional ``torch.compile``, the fused backbone) with
a dynamic batch dimension, so a new batch size does not recompile. Batches smaller than
``compile_min_batch`` run the eager copy instead: at batch 1 the compiled code saves little and a
size-1 dimension is specialised by the compiler anyway.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import device as mdev
from ..lora import merge_lora
from ..te.stack import TransformerStack
from .convert import prepack_stack
from .fp32 import keep_fp32
from .prepack import SMALL_ROWS

logger = logging.getLogger(__name__)

__all__ = ["DTYPES", "InferenceModel", "optimize", "resolve_dtype"]

DTYPES = ("auto", "bf16", "fp32", "fp8")


def resolve_dtype(dtype: str, device: str | torch.device | None = "cpu") -> str:
    """``"auto"`` -> ``"bf16"`` where ``device`` has native bf16, else ``"fp32"``; other values pass through.

    Raises:
        ValueError: ``dtype`` is not one of :data:`DTYPES`.
    """
    if dtype not in DTYPES:
        raise ValueError(f"inference dtype must be one of {DTYPES}; got {dtype!r}")
    if dtype != "auto":
        return dtype
    precision, _ = mdev.choose_precision(device)
    return "bf16" if precision.startswith("bf16") else "fp32"


def _batch_size(args: tuple, kwargs: Mapping[str, Any]) -> int | None:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            return int(v.shape[0])
        if isinstance(v, Mapping):
            n = _batch_size(tuple(v.values()), {})
            if n is not None:
                return n
    return None


def _backbones(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, TransformerStack)]


class InferenceModel(nn.Module):
    """An optimised, frozen model for prediction; call it like the original model.

    Attributes:
        model: the eager (optimised) model.
        compiled: the same model with compiled backbone layers, or None.
        dtype: ``"bf16"``, ``"fp32"`` or ``"fp8"``.
        compile_min_batch: the smallest batch routed to ``compiled``.
    """

    def __init__(self, model: nn.Module, dtype: str, compiled: nn.Module | None = None, compile_min_batch: int = 2):
        super().__init__()
        self.model = model
        self.compiled = compiled
        self.dtype = dtype
        self.compile_min_batch = compile_min_batch

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        target = self.model
        if self.compiled is not None:
            n = _batch_size(args, kwargs)
            if n is not None and n >= self.compile_min_batch:
                target = self.compiled
        with torch.inference_mode():
            return target(*args, **kwargs)

    def train(self, mode: bool = True) -> InferenceModel:
        if mode:
            raise RuntimeError("an InferenceModel is for prediction only; train the original model")
        return super().train(False)


def optimize(
    model: nn.Module,
    dtype: str = "auto",
    compile: bool = False,
    *,
    device: str | torch.device | None = None,
    compile_min_batch: int = 2,
    fp8_recipe: str = "current",
    prepack: bool = True,
) -> InferenceModel:
    """An inference copy of ``model`` (the original is left untouched).

    Args:
        model: a :class:`~mmte.model.MetaTransformer`, an :class:`~mmte.encoders.Encoder`, a
            :class:`~mmte.encoders.Backbone`, or any module containing backbones.
        dtype: ``"auto"``, ``"bf16"``, ``"fp32"`` or ``"fp8"`` (see the module docstring).
        compile: compile the backbone layers (dynamic batch dimension).
        device: where it will run (default: where its parameters are); decides ``"auto"``.
        compile_min_batch: batches smaller than this run eagerly when ``compile`` is on.
        fp8_recipe: the FP8 recipe for ``dtype="fp8"``.
        prepack: on CPUs, reorder the backbones' GEMM weights once into oneDNN's blocked layout for the
            eager model (:func:`~mmte.inference.convert.prepack_stack`; bf16 and fp32).

    Returns:
        an :class:`InferenceModel`.

    Raises:
        ValueError: an unknown ``dtype``, or a model without a backbone for ``"bf16"``/``"fp8"``.
    """
    p = next(model.parameters(), None)
    device = device if device is not None else (p.device if p is not None else "cpu")
    want = resolve_dtype(dtype, device)
    m = copy.deepcopy(model).eval()
    m.requires_grad_(False)
    merged = merge_lora(m)
    if merged:
        logger.info("merged %d LoRA adapter(s) into their Linears' weights (one GEMM each, no hook)", merged)
    backbones = _backbones(m)
    if want in ("bf16", "fp8") and not backbones:
        raise ValueError(f"inference dtype {want!r} applies to mmte backbones; {type(model).__name__} holds none (use dtype='fp32')")
    if want == "bf16":
        for b in backbones:
            b.to(torch.bfloat16)
            b.compute_dtype = torch.bfloat16
    elif want == "fp8":
        from ..fp8 import convert

        for b in backbones:
            convert(b, fp8_recipe, inference=True)
    if want in ("bf16", "fp8"):
        kept = keep_fp32(m)
        if kept:
            logger.info("kept %d speech-embedding stem(s) in fp32 (its convolutions, weights channels-last; input cast to fp32, "
                        "output back) while the backbone runs in %s", kept, want)
    compiled = None
    if compile:  # a second module tree over the same parameters, its layers compiled
        shared = {id(t): t for t in [*m.parameters(), *m.buffers()]}
        compiled = copy.deepcopy(m, memo=shared)
        for b in _backbones(compiled):
            b.fuse(dynamic=True)
    packed = small = 0
    if prepack and want in ("bf16", "fp32") and torch.device(device).type == "cpu":
        for b in backbones:
            n_packed, on = prepack_stack(b, want, rows=128)
            packed += n_packed
            small += on
    n = sum(x.numel() for b in backbones for x in b.parameters())
    logger.info(
        "inference model: %d backbone(s) with %s parameters in %s (asked %r), %d GEMM weight(s) prepacked%s%s",
        len(backbones), f"{n:,}", want, dtype, packed,
        f", inputs of <= {SMALL_ROWS} rows in fp32 on fp16-packed weights" if small else "",
        f", compiled layers for batches >= {compile_min_batch}" if compile else "",
    )
    return InferenceModel(m, want, compiled, compile_min_batch)
