"""``FP8Precision``: a Lightning precision plugin for FP8 training (``trainer.plugins`` in YAML).

It supplies the *forward context* only: ``torch.autocast`` to bf16 (optional) around
:func:`mmte.fp8.autocast` with the configured recipe, for every training/validation/test/predict step.
Converting the model's linears is a separate step that must happen before any parallelism — in
``configure_model``: :class:`~mmte.training.module.MMTEModule` (through its ``fp8_convert`` hook) and
:func:`mmte.parallel.parallelize` call :meth:`FP8Precision.convert_module`. Lightning also calls
``convert_module`` itself in ``strategy.setup``; conversion is idempotent, so a model converted earlier
is left alone, and a single-device run needs nothing else.

Backends: ``"native"`` (mmte.fp8: hardware ``torch._scaled_mm`` or exact emulation) or ``"te"``
(TransformerEngine / MT-TransformerEngine recipes, for models built with ``Backbone(backend="te")``;
needs ``transformer_engine``).

YAML (see ``configs/precision/*.yaml``)::

    trainer:
      plugins:
        - class_path: mmte.training.precision.FP8Precision
          init_args: {recipe: delayed, recipe_args: {amax_history_len: 16}, autocast_dtype: bfloat16}
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision
from torch import nn

from .. import fp8
from ..fp8.recipes import Recipe

logger = logging.getLogger(__name__)

__all__ = ["FP8Precision"]

_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


class FP8Precision(Precision):
    """FP8 GEMMs (+ bf16 autocast for everything else) in every step.

    Args:
        recipe: ``"delayed"``, ``"current"``, ``"block"``, ``"mx"`` or a :class:`mmte.fp8.Recipe`.
        recipe_args: recipe fields (``fp8_format``, ``amax_history_len``, ``margin``, ``pad_tokens``,
            ``gemm``, ``tile``, ``block_size``, ...), when ``recipe`` is a name.
        autocast_dtype: ``"bfloat16"`` (default), ``"float16"`` or None (non-GEMM ops in the parameters'
            dtype).
        device: device type for ``torch.autocast`` (default: the machine's default device type).
        backend: ``"native"`` or ``"te"``.
        amax_reduction_group: process group for delayed-scaling amax reduction (default: the world
            group when torch.distributed is initialised).
    """

    precision = "fp8"

    def __init__(
        self,
        recipe: str | Recipe = "delayed",
        recipe_args: dict[str, Any] | None = None,
        autocast_dtype: str | None = "bfloat16",
        device: str | None = None,
        backend: str = "native",
        amax_reduction_group: Any = None,
    ):
        super().__init__()
        if recipe_args and isinstance(recipe, Recipe):
            raise ValueError("recipe_args only apply when recipe is a name; got a Recipe object and recipe_args")
        self.recipe = fp8.make_recipe(recipe, **(recipe_args or {}))
        if autocast_dtype is not None and autocast_dtype not in _AUTOCAST_DTYPES:
            raise ValueError(f"autocast_dtype must be one of {sorted(_AUTOCAST_DTYPES)} or None; got {autocast_dtype!r}")
        self.autocast_dtype = None if autocast_dtype is None else _AUTOCAST_DTYPES[autocast_dtype]
        if backend not in ("native", "te"):
            raise ValueError(f"backend must be 'native' or 'te'; got {backend!r}")
        if backend == "te":
            from ..te import te_available

            ok, why = te_available()
            if not ok:
                raise RuntimeError(f"FP8Precision(backend='te') needs TransformerEngine: {why}")
        self.backend = backend
        self.device = device
        self.amax_reduction_group = amax_reduction_group

    def _device_type(self) -> str:
        if self.device is not None:
            return torch.device(self.device).type
        from .. import device as mdev

        return mdev.default_device().type

    def check_device(self, device: torch.device | str) -> None:
        """Raise ``RuntimeError`` naming the missing capability when the recipe cannot run on ``device``."""
        ok, why = fp8.is_available(device, self.recipe)
        if not ok:
            raise RuntimeError(f"FP8Precision({self.recipe.name}) cannot run on {device}: {why}")

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Convert the backbone linears to FP8 (idempotent; native backend only)."""
        if self.backend != "native":
            return module
        if any(isinstance(m, fp8.FP8Linear) for m in module.modules()):
            return module
        return fp8.convert(module, self.recipe)

    # the names MMTEModule / mmte.parallel look for
    fp8_convert = convert_module
    convert_model = convert_module

    @contextlib.contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        dev = self._device_type()
        with contextlib.ExitStack() as stack:
            if self.autocast_dtype is not None:
                stack.enter_context(torch.autocast(dev, dtype=self.autocast_dtype))
            if self.backend == "te":  # pragma: no cover - needs CUDA + TE
                import transformer_engine.pytorch as te

                stack.enter_context(te.fp8_autocast(enabled=True, fp8_recipe=fp8.to_te_recipe(self.recipe), fp8_group=self.amax_reduction_group))
            else:
                stack.enter_context(fp8.autocast(recipe=self.recipe, amax_reduction_group=self.amax_reduction_group))
            yield

    def teardown(self) -> None:
        """The run is over: drop pending gradient amaxes (they are saved in the checkpoint's buffers), so a
        later run in this process starts with every rank's FP8 bookkeeping empty."""
        from ..fp8.autocast import reset_pending

        reset_pending()
        super().teardown()

    def convert_input(self, data: Any) -> Any:
        return data

    def convert_output(self, data: Any) -> Any:
        return data

    def __repr__(self) -> str:
        return f"FP8Precision(recipe={self.recipe!r}, autocast_dtype={self.autocast_dtype}, backend={self.backend!r})"
