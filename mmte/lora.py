"""LoRA: low-rank adapters on a backbone's Linears, added as forward hooks so FQNs stay stable.

``W x + (alpha / rank) B A x`` with ``A`` [rank, in] and ``B`` [out, rank]; ``B`` starts at zero, so a
model's output is unchanged when the adapters are added. The adapter is a child module ``lora`` of the
Linear it adapts (parameters ``<linear>.lora.A`` / ``.B``): a later pass that *replaces* Linears (an
FP8 conversion) carries ``lora`` and the hook over. A frozen copy for inference folds each adapter into
its Linear's weight (:func:`merge_lora`): one GEMM instead of three, and no hook, so the packed
inference layers run their flat path.

``lr_scale`` multiplies the learning rate of an adapter's parameters (the optimiser groups of
:func:`mmte.training.optim.param_group_spec` read it from the module): adapters on a pretrained trunk
usually want a smaller step than freshly initialised tokenizers and heads trained beside them.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Sequence

import torch
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_LORA_TARGETS", "LoRA", "apply_lora", "merge_lora"]

DEFAULT_LORA_TARGETS = ("layers.*.self_attention.layernorm_qkv.linear", "layers.*.self_attention.proj")


class LoRA(nn.Module):
    """A low-rank adapter ``scale * B A x`` for one Linear (``A`` [r, in], ``B`` [out, r])."""

    def __init__(
        self, in_features: int, out_features: int, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0, lr_scale: float = 1.0
    ):
        super().__init__()
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"LoRA rank must be a positive int; got {rank!r}")
        if not isinstance(lr_scale, (int, float)) or isinstance(lr_scale, bool) or not 0 < lr_scale < math.inf:
            raise ValueError(f"LoRA lr_scale must be a positive finite number (the adapters' lr = lr * lr_scale); got {lr_scale!r}")
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.lr_scale = float(lr_scale)
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.empty(out_features, rank))
        self.dropout = nn.Dropout(dropout)
        if self.A.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        nn.init.zeros_(self.B)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout.p > 0:
            x = self.dropout(x)
        # the scale multiplies the rank-wide intermediate, not the full-width output: one pass less
        return ((x @ self.A.t().to(x.dtype)) * self.scale) @ self.B.t().to(x.dtype)


def _lora_hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
    return output + module.lora(inputs[0])


def apply_lora(
    backbone: nn.Module,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Sequence[str] | None = None,
    lr_scale: float = 1.0,
) -> list[str]:
    """Attach :class:`LoRA` adapters to the ``nn.Linear`` modules of ``backbone`` matching ``targets``
    (``lr_scale``: the adapters' learning rate as a multiple of the model's).

    Returns:
        the adapted module names.

    Raises:
        ValueError: when a target glob matches no Linear.
    """
    targets = list(targets or DEFAULT_LORA_TARGETS)
    done = []
    for pattern in targets:
        hits = [(n, m) for n, m in backbone.named_modules() if isinstance(m, nn.Linear) and fnmatch.fnmatch(n, pattern)]
        if not hits:
            raise ValueError(f"LoRA target {pattern!r} matches no Linear in the backbone (e.g. 'layers.*.layernorm_mlp.fc1')")
        for n, m in hits:
            if hasattr(m, "lora"):
                continue
            m.lora = LoRA(m.in_features, m.out_features, rank, alpha, dropout, lr_scale).to(device=m.weight.device)
            m.register_forward_hook(_lora_hook)
            done.append(n)
    logger.info("added LoRA (rank %d) to %d backbone Linears", rank, len(done))
    return done


def merge_lora(module: nn.Module) -> int:
    """Fold every :class:`LoRA` adapter inside ``module`` into the weight of the Linear it adapts, in place:
    ``W += scale * B A`` (summed in fp32, stored in the weight's dtype), then the adapter and its hook go. The
    merged Linear computes what the Linear and its adapter computed (in eval mode: an adapter's dropout is
    off) with one GEMM. For frozen inference copies (:func:`mmte.inference.optimize`); the adapter cannot be
    trained or split off again afterwards.

    Returns:
        how many adapters were merged.
    """
    n = 0
    for m in list(module.modules()):
        lora = m._modules.get("lora")
        if not isinstance(lora, LoRA) or not isinstance(getattr(m, "weight", None), torch.Tensor):
            continue
        hooks = [k for k, h in m._forward_hooks.items() if h is _lora_hook]
        if not hooks:
            continue
        with torch.no_grad():
            delta = (lora.B.detach().float() @ lora.A.detach().float()) * lora.scale
            m.weight.copy_((m.weight.float() + delta.to(m.weight.device)).to(m.weight.dtype))
        for k in hooks:
            del m._forward_hooks[k]
        del m._modules["lora"]
        n += 1
    return n
