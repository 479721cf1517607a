"""``Backbone``: the shared transformer trunk every modality's tokens go through.

Stable FQNs (API: tensor-parallel plans, pipeline stage lists, FSDP grouping and checkpoint adapters
use them)::

    norm_pre.*                          optional norm before the first layer (CLIP's ln_pre)
    layers.{i}.self_attention.layernorm_qkv.{norm,linear}.*
    layers.{i}.self_attention.proj.*
    layers.{i}.layernorm_mlp.{norm,fc1,up,fc2}.*
    layers.{i}.{post_attention_layernorm,post_mlp_layernorm}.*   post-norm layers only
    layers.{i}.{ls1,ls2}.gamma                                   layer scale only
    norm.*                              optional final norm

``forward`` runs whatever of these is present, so a pipeline stage that holds ``layers.4..7`` and no
norms is still a ``Backbone``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import torch
from torch import nn

from ..te import Linear, TELayer, TransformerLayer, TransformerStack, fuse, make_norm, one_thread, te_available
from ..te.backend import BACKENDS
from ..te.kernels import use_kernels
from .presets import BackboneConfig, get_preset

logger = logging.getLogger(__name__)

__all__ = ["FUSIONS", "Backbone"]

FUSIONS = ("compile", "kernels")


class Backbone(TransformerStack):
    """A stack of :class:`~mmte.te.TransformerLayer` with optional pre/final norms (a :class:`~mmte.te.TransformerStack`).

    Args:
        config: a :class:`BackboneConfig` or a preset name (``"meta-transformer-b16"``, ``"tiny"``, ...).
        fused: fuse each layer (see :mod:`mmte.te.fusion`); the eager path is the numerical reference.
        fusion: how ``fused`` fuses: ``"compile"`` (regional torch.compile: inductor's C++ kernels on
            CPUs, Triton on GPUs) or ``"kernels"`` (no compile: layers swapped for
            :class:`~mmte.te.kernels.KernelTransformerLayer`, mmte's hand-written Triton add+norm and
            bias+activation kernels where they can run — no warm-up, any shape).
        backend: ``"native"`` (mmte.te) or ``"te"`` (TransformerEngine, when installed).
        params_dtype, device: parameter dtype and device (``"meta"`` for deferred init).
        **overrides: config fields to override (``Backbone("tiny", num_layers=4)``).
    """

    def __init__(
        self,
        config: BackboneConfig | str = "meta-transformer-b16",
        *,
        fused: bool = False,
        fusion: str = "compile",
        backend: str = "native",
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        **overrides,
    ):
        super().__init__()
        if isinstance(config, str):
            config = get_preset(config, **overrides)
        elif overrides:
            config = config.replace(**overrides)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
        if backend == "te":
            ok, why = te_available()
            if not ok:
                raise RuntimeError(f"backend='te' is unavailable: {why}")
        self.config = config
        self.backend = backend
        c = config
        kw = {"params_dtype": params_dtype, "device": device}
        self.norm_pre = make_norm(c.normalization, c.hidden_size, c.layernorm_epsilon, **kw) if c.pre_norm else None
        layer_cls = TELayer if backend == "te" else TransformerLayer
        dpr = [c.drop_path_rate * i / max(c.num_layers - 1, 1) for i in range(c.num_layers)]
        self.layers = nn.ModuleDict(
            {
                str(i): layer_cls(
                    c.hidden_size,
                    c.ffn_hidden_size,
                    c.num_attention_heads,
                    c.layernorm_epsilon,
                    c.hidden_dropout,
                    c.attention_dropout,
                    None,
                    "padding",
                    normalization=c.normalization,
                    activation=c.activation,
                    bias=c.bias,
                    qkv_bias=c.qkv_bias,
                    layer_norm_position=c.layer_norm_position,
                    drop_path_rate=dpr[i],
                    layer_scale_init=c.layer_scale_init,
                    attention_backend=c.attention_backend,
                    **kw,
                )
                for i in range(c.num_layers)
            }
        )
        self.norm = make_norm(c.normalization, c.hidden_size, c.layernorm_epsilon, **kw) if c.final_norm else None
        self.compute_dtype: torch.dtype | None = None
        self.fused = False
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}; got {fusion!r}")
        self.fusion = fusion
        if fused:
            self.fuse()

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def fuse(self, **compile_kwargs) -> Backbone:
        """Fuse every layer (idempotent): compile each as a region, or switch on the hand-written kernels.
        TE layers are already fused kernels."""
        if self.backend == "te":
            logger.info("backend='te' runs TransformerEngine's fused kernels; no compile applied")
            self.fused = True
            return self
        if not self.fused and self.fusion == "kernels":
            use_kernels(self.layers)  # a module swap: KernelTransformerLayer where the kernels cover the layer
            self.fused = True
        if not self.fused:
            for layer in self.layers.values():
                fuse(layer, **compile_kwargs)
            self.fused = True
            logger.info("fused %d/%d backbone layers (regional torch.compile)", len(self.layers), self.config.num_layers)
        return self

    def reset_parameters(self) -> None:
        for m in (self.norm_pre, self.norm):
            if m is not None:
                m.reset_parameters()
        for layer in self.layers.values():
            layer.reset_parameters()

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}, fused={self.fused}, fusion={self.fusion!r}, " + ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())

    def check_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Raise ``ValueError`` naming the shapes when ``x``/``mask`` do not fit this backbone."""
        d = self.config.hidden_size
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"Backbone expects tokens [B, N, {d}]; got {getattr(x, 'shape', type(x))}")
        if x.shape[-1] != d:
            raise ValueError(f"Backbone expects tokens [B, N, {d}] (hidden_size={d}); got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"Backbone expects floating-point tokens; got dtype {x.dtype}")
        p = None if self.compute_dtype is not None else next(self.parameters(), None)  # an inference copy casts itself
        if (
            p is not None
            and p.device.type != "meta"
            and x.dtype != p.dtype
            and not torch.is_autocast_enabled(x.device.type)
            and not (x.dtype in (torch.bfloat16, torch.float16) and p.dtype == torch.float32)
        ):
            raise ValueError(
                f"Backbone parameters are {p.dtype} but tokens are {x.dtype}; cast the tokens or run under autocast"
            )
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2])):
            raise ValueError(
                f"padding mask must be bool [B, N] = {tuple(x.shape[:2])} (True = real token); "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )

    def small_path(self, x: torch.Tensor) -> bool:
        """Whether ``x`` takes the small-row path: ``small_rows`` set, fp32 ``x`` of at most that many rows, no autograd."""
        return (
            bool(self.small_rows) and x.shape[0] * x.shape[1] <= self.small_rows and x.dtype == torch.float32
            and not torch.is_grad_enabled()
        )

    def lowp_dtype(self, x: torch.Tensor) -> torch.dtype | None:
        """The dtype the low-precision path runs ``x`` in, or None to leave ``x``'s dtype unchanged.

        ``compute_dtype`` when set (e.g. by :func:`mmte.inference.optimize`), except for inputs of at most
        ``small_rows`` rows without autograd (those stay fp32 for the small-row path); otherwise bf16 when ``x``'s
        device runs under bf16 autocast (Lightning's ``bf16-mixed``) and every GEMM is a plain
        :class:`~mmte.te.Linear` or says it takes that path (``lowp_cast``, as a prepacked
        :class:`mmte.inference.PackedLinear` does); FP8 and TE layers keep their own precision handling.
        """
        if self.compute_dtype is not None:
            if self.small_path(x):
                return None  # few rows: the fp32 small-row path of mmte.inference (see TransformerStack)
            return self.compute_dtype
        dev = x.device.type
        if self.backend != "native" or not torch.is_autocast_enabled(dev) or torch.get_autocast_dtype(dev) != torch.bfloat16:
            return None
        if any(isinstance(m, nn.Linear) and not (type(m).forward is Linear.forward or getattr(m, "lowp_cast", False))
               for m in self.layers.modules()):
            return None
        return torch.bfloat16

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Args:
            x: tokens ``[B, N, D]``.
            mask: bool ``[B, N]``, True for real tokens; None when every token is real.

        Returns:
            hidden states ``[B, N, D]`` in ``x``'s dtype.

        Under bf16 autocast, or with ``compute_dtype`` set, the layers run the bf16 path of
        :mod:`mmte.te.lowp` (activations and GEMMs in bf16 on fp32 master weights, norm statistics
        and softmax in fp32) with autocast switched off inside, so no op is cast back and forth.
        """
        self.check_input(x, mask)
        if mask is not None and not torch.compiler.is_exporting() and bool(mask.all()):
            mask = None  # no padding: take SDPA's fastest kernel (exported graphs keep the mask: no data-dependent branch)
        if self.small_path(x):
            with one_thread():  # fbgemm's kernel is single-threaded; the rest too small to split
                return self._run(x, mask)
        dt = self.lowp_dtype(x)
        if dt is not None and dt != x.dtype:
            with torch.autocast(x.device.type, enabled=False):
                return self._run(x.to(dt), mask).to(x.dtype)
        return self._run(x, mask)

    def _run(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.norm_pre is not None:
            x = self.norm_pre(x)
        for layer in self.layers.values():
            x = layer(x, mask)
        if self.norm is not None:
            x = self.norm(x)
        return x
