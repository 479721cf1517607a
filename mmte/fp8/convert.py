"""``mmte.fp8.convert``: swap a model's GEMM modules for :class:`~mmte.fp8.FP8Linear`.

By default only the shared backbone's linears are converted (QKV, attention projection, fc1, up, fc2 of
every layer of each backbone, :class:`~mmte.te.TransformerStack`, in the model), and only those whose sizes are
multiples of 16; tokenizers and heads stay in high precision (they are small, and their inputs or
outputs — pixels, logits — are where precision matters most). Converted modules share the original
parameter objects, so conversion works on the meta device and before or after building an optimizer;
it must happen before tensor parallelism or FSDP wrap the model (``configure_model``'s order).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from .linear import FP8Linear
from .recipes import DelayedScaling, Recipe, make_recipe

logger = logging.getLogger(__name__)

__all__ = ["convert", "default_filter", "freeze_fp8_weights", "weight_memory"]

FilterFn = Callable[[str, nn.Module], bool]


def _dims_ok(module: nn.Linear, multiple: int = 16) -> bool:
    return module.in_features % multiple == 0 and module.out_features % multiple == 0


def default_filter(fqn: str, module: nn.Module) -> bool:
    """Whether a module (already known to be inside a backbone) is converted: an ``mmte.te.Linear`` with
    both sizes divisible by 16."""
    from ..te.linear import Linear

    return isinstance(module, Linear) and _dims_ok(module)


def _backbone_prefixes(model: nn.Module) -> list[str]:
    from ..te.stack import TransformerStack

    return [name for name, m in model.named_modules() if isinstance(m, TransformerStack)]


def _set_submodule(model: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, child = fqn.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def convert(
    model: nn.Module,
    recipe: Recipe | str | None = None,
    filter: FilterFn | None = None,
    *,
    inference: bool = False,
) -> nn.Module:
    """Convert linears to :class:`FP8Linear` in place and return the model.

    Args:
        model: any module (a Backbone, a MetaTransformer, a LightningModule...). A bare ``nn.Linear``
            is converted and returned.
        recipe: :class:`~mmte.fp8.Recipe` or short name; sizes the amax history and is the layout of
            inference weights (default :class:`~mmte.fp8.DelayedScaling`).
        filter: ``filter(fqn, module) -> bool`` choosing among *all* ``nn.Linear`` modules of the model;
            the default converts backbone linears whose sizes are multiples of 16. A chosen module whose
            sizes are not multiples of 16 raises ``ValueError``.
        inference: also replace the weights by FP8 codes + scales (:meth:`FP8Linear.freeze_fp8_weight`).

    Already-converted modules are left alone (conversion is idempotent).
    """
    recipe = DelayedScaling() if recipe is None else make_recipe(recipe)
    if isinstance(model, nn.Linear) and not isinstance(model, FP8Linear):
        if filter is not None and not filter("", model):
            return model
        new = FP8Linear.from_linear(model, recipe)
        if inference:
            new.freeze_fp8_weight()
        logger.info("converted 1/1 Linear to FP8 (%s)", recipe.name)
        return new
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if filter is None:
        prefixes = _backbone_prefixes(model)

        def in_backbone(n: str) -> bool:
            return any(p == "" or n == p or n.startswith(p + ".") for p in prefixes)

        chosen = [(n, m) for n, m in linears if in_backbone(n) and default_filter(n, m)]
    else:
        chosen = [(n, m) for n, m in linears if filter(n, m)]
    converted = 0
    for name, module in chosen:
        if isinstance(module, FP8Linear):
            if inference:
                module.freeze_fp8_weight()
            converted += 1
            continue
        new = FP8Linear.from_linear(module, recipe)  # raises on sizes that are not multiples of 16
        if inference:
            new.freeze_fp8_weight()
        _set_submodule(model, name, new)
        converted += 1
    logger.info(
        "converted %d/%d Linear to FP8 (%s%s)", converted, len(linears), recipe.name, ", FP8 inference weights" if inference else ""
    )
    return model


def freeze_fp8_weights(model: nn.Module) -> nn.Module:
    """Store every FP8Linear's weight as FP8 codes + scales (inference); returns the model."""
    n = 0
    for m in model.modules():
        if isinstance(m, FP8Linear) and not m.fp8_inference:
            m.freeze_fp8_weight()
            n += 1
    logger.info("stored %d FP8Linear weights in FP8 for inference", n)
    return model


def weight_memory(model: nn.Module, *, linears_only: bool = True) -> int:
    """Bytes held by weights: each linear's ``weight`` (+ ``weight_scale_inv``) and ``bias``.

    With ``linears_only=False`` every parameter and persistent tensor of the state dict counts, except
    FP8 scaling-state buffers.
    """
    total = 0
    if not linears_only:
        for k, v in model.state_dict().items():
            if not k.rsplit(".", 1)[-1].startswith("fp8_"):
                total += v.numel() * v.element_size()
        return total
    for m in model.modules():
        if isinstance(m, nn.Linear):
            for name in ("weight", "weight_scale_inv", "bias"):
                t = getattr(m, name, None)
                if t is not None:
                    total += t.numel() * t.element_size()
    return total
