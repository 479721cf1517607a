"""How a layer is fused.

``fuse(module)`` compiles a module *regionally*, in place (``nn.Module.compile``): each transformer
layer becomes one compiled region. Dynamo traces the layer once and, because parameters are graph
inputs (``inline_inbuilt_nn_modules``), every layer of a backbone reuses the same compiled code.
Inductor then fuses everything between the GEMMs into single kernels — on the CPU as vectorised C++
loops, on CUDA/MUSA as Triton kernels:

* LayerNorm (+ the affine) writes the normalised activations once (``norm -> QKV`` / ``norm -> fc1``);
* bias + activation are folded into one pass over the fc1 output;
* bias + dropout + layer scale + residual add become one pass over each branch output;
* the QKV split/transposes become views or fold into the attention kernel's input copy.

The eager path (``fused=False``) runs the same modules op by op and is the numerical reference.
State-dict keys do not change (no ``_orig_mod`` wrapper).
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["compile_supported", "fuse", "is_fused", "unfuse"]


def compile_supported() -> tuple[bool, str]:
    """Whether ``torch.compile`` can be used here; (False, reason) when it cannot."""
    if os.environ.get("MMTE_DISABLE_COMPILE", "0") == "1":
        return False, "MMTE_DISABLE_COMPILE=1"
    if not hasattr(torch, "compile"):
        return False, "this torch has no torch.compile"
    try:
        import importlib

        importlib.import_module("torch._dynamo")
    except Exception as e:  # noqa: BLE001  # pragma: no cover - any import failure means no compile, reported
        return False, f"torch._dynamo does not import: {e}"
    return True, ""


def fuse(module: nn.Module, *, mode: str | None = None, dynamic: bool | None = None) -> nn.Module:
    """Compile ``module`` in place as one fused region and return it.

    Args:
        mode: torch.compile mode (``None``/"default", "max-autotune", ...).
        dynamic: passed to torch.compile (``None``: static first, dynamic after a shape change).
    """
    ok, why = compile_supported()
    if not ok:
        logger.warning("fused execution unavailable (%s); running eager", why)
        return module
    module.compile(mode=mode, dynamic=dynamic)
    module._mmte_fused = True
    return module


def unfuse(module: nn.Module) -> nn.Module:
    """Undo :func:`fuse` (back to the eager forward)."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        module._compiled_call_impl = None
    module._mmte_fused = False
    return module


def is_fused(module: nn.Module) -> bool:
    return bool(getattr(module, "_mmte_fused", False))
