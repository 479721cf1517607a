"""What :class:`~mmte.training.strategy.MMTEStrategy` needs from the LightningModule it trains.

:class:`ParallelModule` names it once. :class:`~mmte.training.module.MMTEModule` satisfies it (its
checkpoint and pipeline mixins, :mod:`mmte.training.checkpoint_hooks` and
:mod:`mmte.training.pipeline_hooks`, hold most of it). Any other LightningModule that exposes its
network as ``model`` (and optionally its loss as ``loss_fn``) is taken through :class:`PlainModule`,
which fills the rest with defaults: a batch ``(x, ..., y)``, cross-entropy, the loss logged as
``{stage}_loss``. The strategy and its pipeline runner call the interface directly; whether a module
is one or the other is decided in one place, :func:`as_parallel_module`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ParallelModule", "PlainModule", "as_parallel_module"]


@runtime_checkable
class ParallelModule(Protocol):
    """The LightningModule side of DP x TP x PP training.

    Attributes:
        model: the network (an ``nn.Module`` holding an mmte ``Backbone``); None until
            ``configure_model`` builds it. The strategy replaces it with the parallelised one.
        hparams: the module's hyper-parameters; the strategy reads ``backbone`` (its shape, before the
            model is built), ``fusion`` and ``mixup`` (what pipeline parallel cannot run).
        automatic_optimization: switched off under pipeline parallel, where the strategy steps.
        shares_pipeline_boundary: whether the first pipeline stage describes what the stages pass each
            other (``stage(**inputs, boundary=True)``, :mod:`mmte.model_stages`) for the later stages.
        fp8_convert: the FP8 conversion applied before the parallel plan, or None.
    """

    model: nn.Module | None
    hparams: Mapping[str, Any]
    automatic_optimization: bool
    shares_pipeline_boundary: bool

    @property
    def fp8_convert(self) -> Callable[..., Any] | None: ...

    def meta_model(self) -> nn.Module | None:
        """The whole model on the meta device (what a checkpoint describes, whatever this rank holds)."""
        ...

    def materialize(self, device: torch.device | str) -> None:
        """Allocate this rank's (sharded) parameters on ``device``, initialise them and load pretrained weights."""
        ...

    def optimizer_param_names(self, model: nn.Module | None = None) -> list[list[str]]:
        """The checkpoint FQNs of each optimizer group, in order, for ``model`` (default: the whole model)."""
        ...

    def pipeline_inputs(self, batch: Any) -> tuple[tuple, dict[str, Any], Any]:
        """``(args, kwargs, target)`` of a batch for the pipeline schedule."""
        ...

    def pipeline_loss(self, output: Any, target: Any = None) -> torch.Tensor:
        """The last stage's loss of one microbatch."""
        ...

    def set_pipeline_boundary(self, struct: Any) -> None:
        """Receive the structure the stages pass each other (see ``shares_pipeline_boundary``)."""
        ...

    def pipeline_outputs(self, merged: Any, batch: Any, stage: str, losses: list[torch.Tensor]) -> torch.Tensor | None:
        """After a pipeline step, on the rank holding the last stage: the batch's loss (None elsewhere)."""
        ...

    def pipeline_log(self, batch: Any, stage: str, loss: torch.Tensor) -> None:
        """Log the loss every pipeline rank now shares."""
        ...


class PlainModule:
    """:class:`ParallelModule` over a LightningModule that exposes only its network as ``model``.

    The defaults: the batch is ``(x, ..., y)``; the loss is the module's ``loss_fn`` when it has one,
    else cross-entropy; no boundary is shared between stages; the strategy's materialisation is
    Lightning's (``reset_parameters`` on each module); the loss is logged as ``{stage}_loss``.
    """

    shares_pipeline_boundary = False
    fp8_convert = None

    def __init__(self, module: Any) -> None:
        self.module = module

    @property
    def model(self) -> nn.Module | None:
        return getattr(self.module, "model", None)

    @model.setter
    def model(self, value: nn.Module) -> None:
        self.module.model = value

    @property
    def hparams(self) -> Mapping[str, Any]:
        return getattr(self.module, "hparams", None) or {}

    @property
    def automatic_optimization(self) -> bool:
        return self.module.automatic_optimization

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self.module.automatic_optimization = value

    def meta_model(self) -> nn.Module | None:
        return None

    def materialize(self, device: torch.device | str) -> None:
        return None

    def optimizer_param_names(self, model: nn.Module | None = None) -> list[list[str]]:
        raise TypeError(
            f"loading a single-process checkpoint's optimizer under MMTEStrategy needs {type(self.module).__name__}."
            "optimizer_param_names() (the parameter FQNs of each optimizer group); it has none"
        )

    def pipeline_inputs(self, batch: Any) -> tuple[tuple, dict[str, Any], Any]:
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            return (batch[0],), {}, batch[-1]
        raise TypeError(
            f"pipeline parallel needs (inputs, target) from the batch: define {type(self.module).__name__}.pipeline_inputs(batch) "
            f"or return (x, y) batches; got {type(batch).__name__}"
        )

    def pipeline_loss(self, output: Any, target: Any = None) -> torch.Tensor:
        fn = getattr(self.module, "loss_fn", None)
        return (fn if callable(fn) else F.cross_entropy)(output, target)

    def set_pipeline_boundary(self, struct: Any) -> None:
        return None

    def pipeline_outputs(self, merged: Any, batch: Any, stage: str, losses: list[torch.Tensor]) -> torch.Tensor | None:
        """The mean microbatch loss in training; the loss of the merged outputs in evaluation."""
        if merged is not None and stage != "train":
            losses = [self.pipeline_loss(merged, self.pipeline_inputs(batch)[2])]
        return torch.stack([x.detach().float() for x in losses]).mean() if losses else None

    def pipeline_log(self, batch: Any, stage: str, loss: torch.Tensor) -> None:
        t = batch[0] if isinstance(batch, (tuple, list)) else None
        self.module.log(f"{stage}_loss", loss, prog_bar=True, batch_size=int(t.shape[0]) if isinstance(t, torch.Tensor) else None)


def as_parallel_module(module: Any) -> ParallelModule:
    """``module`` itself when it implements :class:`ParallelModule`, else a :class:`PlainModule` over it."""
    return module if isinstance(module, ParallelModule) else PlainModule(module)
