"""``FP8Linear``: an :class:`mmte.te.Linear` whose three GEMMs run in FP8 inside ``mmte.fp8.autocast``.

A linear layer ``y = x W^T + b`` costs three GEMMs per training step, and all three run in FP8::

    fprop   y  = x  . W^T      x: E4M3 (activation)      W: E4M3 (weight)
    dgrad   dx = dy . W        dy: E5M2 under HYBRID      W: E4M3
    wgrad   dW = dy^T . x      dy: E5M2 under HYBRID      x: E4M3

Each operand is quantized along that GEMM's contraction dimension (see :mod:`mmte.fp8.gemm`). With
per-tensor scales the forward's quantized ``x`` and ``W`` are saved and reused (transposed) by the
backward — FP8 activations halve the memory kept for backward. Block recipes keep a 128x128-block
weight for both GEMMs but must requantize ``x`` and ``dy`` along the token dimension for the wgrad
(1x128 tiles run along the contraction); MXFP8 requantizes every operand for its GEMM.

Everything else stays in high precision: the bias add and its gradient (a sum over tokens), the output
(the autocast dtype, else the input's dtype) and the gradients returned to ``x`` and ``W`` (their dtypes).

Shapes: ``x`` is ``[..., K]``, flattened to ``[M, K]`` rows. FP8 GEMM kernels need M, K and N to be
multiples of 16; K and N are fixed by the layer (checked at construction), M = batch x tokens is not
(ViT's 197 tokens). With ``recipe.pad_tokens`` the rows are zero-padded to the next multiple of 16 and
the result sliced (zero rows change neither the amaxes nor the real rows' outputs, and their output
gradients are zero); without it a non-divisible M raises ``ValueError`` naming the shape.

Tensor parallelism: after ``ColwiseParallel`` / ``RowwiseParallel`` (DTensor weights on a 1-d mesh) each
rank runs the FP8 GEMMs on its shards and returns the DTensor layouts the TP styles expect; delayed-
scaling amaxes reduced over the TP group give every rank the scales of the unsharded layer.

Scaling state (delayed scaling) lives in buffers that ``state_dict`` saves, so a resumed run continues
with its amax history: ``fp8_amax_history`` [3, L] (rows: input, weight, output gradient; newest first),
``fp8_scale`` [3] and ``fp8_amax_pending`` [3] (amaxes recorded since the last update). A checkpoint
without them (a high-precision model's) loads with fresh scaling state.

Bad amaxes (delayed scaling): an update whose amax is 0 or not finite keeps the history and the scale as
they were; ``fp8_bad_amax`` [2, 3] (not saved) counts, per role, the consecutive non-finite updates (row
0) and all skipped updates (row 1). :func:`check_bad_amax` (called once per update round by
:mod:`mmte.fp8.autocast`) logs the first one (once per process, until :func:`reset_bad_amax_log`) and
raises after ``recipe.max_bad_amax_steps`` in a row.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..te.linear import Linear
from .autocast import _count_gemm, _register_backward, _register_forward, get_fp8_context
from .formats import FP8Dtype
from .gemm import fp8_gemm, select_gemm
from .quantize import QuantizedTensor, amax, quantize_blockwise, quantize_mx, quantize_tensorwise, scale_from_amax
from .recipes import MXFP8, BlockScaling, DelayedScaling, Recipe, delayed_scale

logger = logging.getLogger(__name__)

__all__ = ["ROLES", "FP8Linear", "check_bad_amax", "reset_bad_amax_log"]

ROLES = ("input", "weight", "grad_output")
_IN, _W, _GRAD = 0, 1, 2
_FP8_BUFFERS = ("fp8_amax_history", "fp8_scale", "fp8_amax_pending")


@functools.lru_cache(maxsize=64)
def _path(device_type: str, device_index: int | None, recipe: Recipe) -> str:
    return select_gemm(torch.device(device_type, device_index) if device_index is not None else device_type, recipe)


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "device_mesh")


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    t = x.device.type
    if torch.is_autocast_enabled(t):
        return torch.get_autocast_dtype(t)
    return x.dtype


class _FP8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, module, recipe, group, out_dtype, path):
        fwd = recipe.fp8_format.fwd
        qx = module._quantize(x2, _IN, fwd, recipe, "act")
        qw = module._quantize(weight, _W, fwd, recipe, "weight")
        y = fp8_gemm(qx, qw, torch.float32, path)
        if bias is not None:
            y = y + bias.float()
        _count_gemm()
        if recipe.needs_history:
            _register_forward(module, recipe)
        ctx.module, ctx.recipe, ctx.group, ctx.path = module, recipe, group, path
        ctx.x_dtype, ctx.has_bias = x2.dtype, bias is not None
        if recipe.tensorwise or isinstance(recipe, BlockScaling):
            ctx.qw = qw  # square blocks transpose; per-tensor scales too
        if recipe.tensorwise:
            ctx.qx = qx
            ctx.save_for_backward(weight)
        else:
            ctx.save_for_backward(x2, weight)
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy):
        module, recipe, path = ctx.module, ctx.recipe, ctx.path
        fwd, bwd = recipe.fp8_format.fwd, recipe.fp8_format.bwd
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if recipe.tensorwise:
            (weight,) = ctx.saved_tensors
            x2 = None
        else:
            x2, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        qdy = module._quantize(dy, _GRAD, bwd, recipe, "act")  # tiles along N: the dgrad contraction
        if recipe.needs_history:
            _register_backward(module, recipe, ctx.group)
        if need_x:
            if isinstance(recipe, MXFP8):
                qwt = quantize_mx(weight.t(), fwd, recipe.block_size, recipe.scale_rounding)
            else:
                qwt = ctx.qw.t()
            dx = fp8_gemm(qdy, qwt, torch.float32, path).to(ctx.x_dtype)
        if need_w:
            if recipe.tensorwise:
                qdyt, qxt = qdy.t(), ctx.qx.t()
            elif isinstance(recipe, BlockScaling):
                qdyt = quantize_blockwise(dy.t(), bwd, (1, recipe.tile), recipe.power_2_scale)
                qxt = quantize_blockwise(x2.t(), fwd, (1, recipe.tile), recipe.power_2_scale)
            else:
                qdyt = quantize_mx(dy.t(), bwd, recipe.block_size, recipe.scale_rounding)
                qxt = quantize_mx(x2.t(), fwd, recipe.block_size, recipe.scale_rounding)
            dw = fp8_gemm(qdyt, qxt, torch.float32, path).to(weight.dtype)
        if need_b and ctx.has_bias:
            db = dy.float().sum(0).to(weight.dtype if module.bias is None else module.bias.dtype)
        # ctx.qx / ctx.qw are kept: zero-bubble pipeline schedules run this backward twice on one graph (input
        # gradients first, weight gradients later); they are freed with the graph
        return dx, dw, db, None, None, None, None, None


class FP8Linear(Linear):
    """A :class:`mmte.te.Linear` that runs FP8 GEMMs inside :func:`mmte.fp8.autocast`.

    Parameters, their names and state-dict keys are those of the high-precision layer (tensor-parallel
    plans and checkpoints apply unchanged); the FP8 scaling state adds three buffers (see the module
    docstring). Outside an FP8 region it is an ordinary linear.

    Args:
        in_features, out_features: GEMM sizes; multiples of 16 (the FP8 GEMM rule).
        bias, init_method, params_dtype, device: as :class:`mmte.te.Linear`.
        recipe: the conversion recipe: sizes the amax history and is used by frozen (inference) weights;
            at run time the autocast region's recipe applies.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        recipe: Recipe | None = None,
        init_method: Callable[[torch.Tensor], None] | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        self._check_dims(in_features, out_features)
        super().__init__(in_features, out_features, bias, init_method=init_method, params_dtype=params_dtype, device=device)
        self._init_fp8(recipe)

    @staticmethod
    def _check_dims(in_features: int, out_features: int, multiple: int = 16) -> None:
        if in_features % multiple or out_features % multiple:
            raise ValueError(
                f"FP8 GEMMs need in_features and out_features divisible by {multiple}; "
                f"got Linear({in_features}, {out_features}) (weight shape ({out_features}, {in_features}))"
            )

    def _init_fp8(self, recipe: Recipe | None) -> None:
        self.fp8_recipe = recipe if recipe is not None else DelayedScaling()
        if not isinstance(self.fp8_recipe, Recipe):
            raise TypeError(f"recipe must be an mmte.fp8 Recipe; got {type(recipe).__name__}")
        hist = self.fp8_recipe.amax_history_len if self.fp8_recipe.needs_history else 1
        dev = self.weight.device
        self.register_buffer("fp8_amax_history", torch.zeros(3, hist, device=dev))
        self.register_buffer("fp8_scale", torch.ones(3, device=dev))
        self.register_buffer("fp8_amax_pending", torch.zeros(3, device=dev))
        self.register_buffer("fp8_bad_amax", torch.zeros(2, 3, dtype=torch.int32, device=dev), persistent=False)
        self.fp8_inference = False
        self.weight_block: tuple[int, int] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Recipe | None = None) -> FP8Linear:
        """An FP8Linear sharing ``linear``'s parameter objects (optimizers and FSDP/TP sharding see the same
        tensors; works on the meta device)."""
        cls._check_dims(linear.in_features, linear.out_features)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.init_method = getattr(linear, "init_method", None)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        new._init_fp8(recipe)
        # adapters and hooks attached to the linear (LoRA is a child module plus a forward hook) come along:
        # the base GEMM runs in FP8, the adapter path in the autocast dtype
        for name, child in linear.named_children():
            new.add_module(name, child)
        new._forward_hooks.update(linear._forward_hooks)
        new._forward_hooks_with_kwargs.update(linear._forward_hooks_with_kwargs)
        new._forward_hooks_always_called.update(linear._forward_hooks_always_called)
        new._forward_pre_hooks.update(linear._forward_pre_hooks)
        new._forward_pre_hooks_with_kwargs.update(linear._forward_pre_hooks_with_kwargs)
        return new

    def reset_parameters(self) -> None:
        if getattr(self, "fp8_inference", False):
            raise RuntimeError("an FP8Linear with frozen FP8 inference weights cannot be re-initialised")
        super().reset_parameters()
        self.reset_fp8_state()

    def reset_fp8_state(self) -> None:
        """Forget the amax history (scales back to 1, nothing pending)."""
        if hasattr(self, "fp8_amax_history"):
            with torch.no_grad():
                self.fp8_amax_history.zero_()
                self.fp8_scale.fill_(1.0)
                self.fp8_amax_pending.zero_()
                if hasattr(self, "fp8_bad_amax"):
                    self.fp8_bad_amax.zero_()

    def extra_repr(self) -> str:
        mode = ", inference weights" if self.fp8_inference else ""
        return super().extra_repr() + f", fp8_recipe={self.fp8_recipe.name}{mode}"

    # --- state dict: FP8 state optional, history length adapted -----------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        present = {n: prefix + n in state_dict for n in _FP8_BUFFERS}
        key = prefix + "fp8_amax_history"
        if present["fp8_amax_history"]:
            h = state_dict[key]
            want = self.fp8_amax_history.shape[1]
            if h.dim() == 2 and h.shape[0] == 3 and h.shape[1] != want:
                fixed = torch.zeros(3, want, dtype=h.dtype, device=h.device)
                n = min(want, h.shape[1])
                fixed[:, :n] = h[:, :n]
                state_dict[key] = fixed
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        for n in _FP8_BUFFERS:  # a high-precision checkpoint: start with fresh scaling state
            if not present[n] and prefix + n in missing_keys:
                missing_keys.remove(prefix + n)
        # a checkpoint saved between a backward and the next forward holds a pending gradient amax:
        # queue it so the next autocast entry applies it, exactly as in the run that saved it
        p = self.fp8_amax_pending
        if present["fp8_amax_pending"] and isinstance(self.fp8_recipe, DelayedScaling) and p.device.type != "meta" and bool(p[_GRAD] != 0):
            _register_backward(self, self.fp8_recipe, None)

    # --- quantization --------------------------------------------------------------------------------
    def _ensure_history(self, length: int) -> None:
        h = self.fp8_amax_history
        if h.shape[1] != length:
            new = torch.zeros(3, length, dtype=h.dtype, device=h.device)
            n = min(length, h.shape[1])
            new[:, :n] = h[:, :n]
            self.fp8_amax_history = new

    def _quantize(self, t: torch.Tensor, role: int, fmt: FP8Dtype, recipe: Recipe, kind: str) -> QuantizedTensor:
        """Quantize a 2-d operand with its contraction along the last dimension."""
        if isinstance(recipe, BlockScaling):
            block = (recipe.block, recipe.block) if kind == "weight" else (1, recipe.tile)
            return quantize_blockwise(t, fmt, block, recipe.power_2_scale)
        if isinstance(recipe, MXFP8):
            return quantize_mx(t, fmt, recipe.block_size, recipe.scale_rounding)
        a = amax(t)
        jit = scale_from_amax(a, fmt.max, recipe.margin)
        if isinstance(recipe, DelayedScaling):
            with torch.no_grad():
                self._ensure_history(recipe.amax_history_len)
                seen = (self.fp8_amax_history[role] != 0).any()  # NaN/inf entries count as seen
                scale = torch.where(seen, self.fp8_scale[role], jit)
                self.fp8_amax_pending[role] = torch.maximum(self.fp8_amax_pending[role], a)
        else:
            scale = jit
        return quantize_tensorwise(t, fmt, scale)

    @staticmethod
    def _fp8_check_round(modules: list[FP8Linear]) -> None:
        """:func:`check_bad_amax` after an update round (``mmte.fp8.autocast`` calls it on the modules it updated)."""
        check_bad_amax(modules)

    @torch.no_grad()
    def _fp8_update(self, recipe: Recipe, roles: tuple[int, ...]) -> None:
        """Push the pending amaxes of ``roles`` into the history and recompute their scales."""
        if not isinstance(recipe, DelayedScaling):
            return
        self._ensure_history(recipe.amax_history_len)
        bad = self.fp8_bad_amax
        for r in roles:
            fmt = recipe.fp8_format.bwd if r == _GRAD else recipe.fp8_format.fwd
            a = self.fp8_amax_pending[r].clone()
            self.fp8_amax_pending[r] = 0.0
            finite = torch.isfinite(a)
            good = finite & (a > 0)
            # only a usable amax enters the history; 0 or inf/NaN keep history and scale as they were
            h = self.fp8_amax_history[r]
            pushed = torch.roll(h, 1)
            pushed[0] = torch.where(good, a, 0.0)
            h.copy_(torch.where(good, pushed, h))
            self.fp8_scale[r] = torch.where(good, delayed_scale(h, self.fp8_scale[r], fmt.max, recipe.margin, recipe.amax_compute_algo),
                                            self.fp8_scale[r])
            bad[0, r] = torch.where(~finite, bad[0, r] + 1, torch.where(good, torch.zeros_like(bad[0, r]), bad[0, r]))
            bad[1, r] += (~good).to(bad.dtype)

    # --- forward -------------------------------------------------------------------------------------
    def _rows(self, x: torch.Tensor, recipe: Recipe, in_features: int | None = None) -> tuple[torch.Tensor, int]:
        k = self.in_features if in_features is None else in_features
        if x.shape[-1] != k:
            raise ValueError(f"FP8Linear({self.in_features}, {self.out_features}) expects inputs [..., {k}]; got shape {tuple(x.shape)}")
        x2 = x.reshape(-1, k)
        m = x2.shape[0]
        pad = (-m) % recipe.multiple
        if pad:
            if not recipe.pad_tokens:
                raise ValueError(
                    f"FP8 GEMMs need the token rows divisible by {recipe.multiple}: input shape {tuple(x.shape)} flattens to "
                    f"{m} rows (batch x tokens); pad the sequence to a multiple of {recipe.multiple} (e.g. {m + pad} rows) "
                    "or use a recipe with pad_tokens=True"
                )
            x2 = F.pad(x2, (0, 0, 0, pad))
        return x2, m

    def _fp8_local(self, x, weight, bias, region) -> torch.Tensor:
        """The FP8 GEMM on plain (local) tensors: ``x`` [..., K_local] -> [..., N_local]."""
        recipe = region.recipe
        n, k = weight.shape
        x2, m = self._rows(x, recipe, k)
        path = _path(x.device.type, x.device.index, recipe)
        y = _FP8LinearFn.apply(x2, weight, bias, self, recipe, region.group, _out_dtype(x), path)
        return y[:m].reshape(*x.shape[:-1], n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8_inference:
            return self._inference_forward(x)
        region = get_fp8_context()
        if region is None or not region.enabled:
            return super().forward(x)
        if _is_dtensor(self.weight):
            return self._forward_tensor_parallel(x, region)
        return self._fp8_local(x, self.weight, self.bias, region)

    def _forward_tensor_parallel(self, x, region) -> torch.Tensor:
        """FP8 under tensor parallelism (weights sharded by ColwiseParallel / RowwiseParallel on a 1-d mesh).

        Each rank runs the FP8 GEMM on its shards: column-wise (weight ``Shard(0)``) takes the replicated
        input and returns ``Shard(-1)`` outputs; row-wise (weight ``Shard(1)``) takes ``Shard(-1)`` inputs
        and returns a ``Partial`` sum, to which the replicated bias is added once. Scales are per rank;
        under delayed scaling the amax reduction over the TP group makes them equal on every rank.
        """
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        for name in _FP8_BUFFERS:  # distribute_module replicates buffers: the scaling state stays per rank
            b = self._buffers[name]
            if _is_dtensor(b):
                self._buffers[name] = b.to_local()
        w = self.weight
        if w.device_mesh.ndim != 1:
            raise ValueError(f"FP8Linear supports weights sharded on a 1-d mesh; got placements {w.placements} on a {w.device_mesh.ndim}-d mesh")
        (pl,) = w.placements
        mesh = w.device_mesh
        if pl == Replicate():
            x_l = x.to_local() if isinstance(x, DTensor) else x
            b_l = self.bias.to_local() if isinstance(self.bias, DTensor) else self.bias
            y = self._fp8_local(x_l, w.to_local(), b_l, region)
            return DTensor.from_local(y, mesh, [Replicate()], run_check=False) if isinstance(x, DTensor) else y
        if pl == Shard(0):  # column-wise: input replicated, output sharded on features
            if isinstance(x, DTensor):
                # each rank's input gradient is its partial sum over the output shards
                x = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
            b_l = self.bias.to_local() if isinstance(self.bias, DTensor) else self.bias
            y = self._fp8_local(x, w.to_local(), b_l, region)
            return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
        if pl == Shard(1):  # row-wise: input sharded on features, partial output
            if isinstance(x, DTensor):
                x = x.redistribute(mesh, [Shard(x.dim() - 1)]).to_local()
            y = self._fp8_local(x, w.to_local(), None, region)
            out = DTensor.from_local(y, mesh, [Partial()], run_check=False)
            if self.bias is not None:
                bias = self.bias if isinstance(self.bias, DTensor) else DTensor.from_local(self.bias, mesh, [Replicate()], run_check=False)
                # as DTensor's own linear: reduce the partial sums, then add the replicated bias once
                out = out.redistribute(mesh, [Replicate()]) + bias.to(out.dtype)
            return out
        raise ValueError(f"FP8Linear under tensor parallelism expects weight placements Shard(0), Shard(1) or Replicate(); got {pl}")

    # --- inference weights ---------------------------------------------------------------------------
    @torch.no_grad()
    def freeze_fp8_weight(self) -> FP8Linear:
        """Replace the weight by FP8 codes + scales (``weight``, ``weight_scale_inv`` buffers), for inference.

        The layout follows :attr:`fp8_recipe`: one scale (current scaling of the weight), 128x128 blocks
        (block recipe) or 1x32 E8M0 blocks along ``in_features`` (MXFP8). The module then only runs
        forward passes, in FP8 whether or not an autocast region is active.
        """
        if self.fp8_inference:
            return self
        recipe = self.fp8_recipe
        fmt = recipe.fp8_format.fwd
        w = self.weight.detach()
        if isinstance(recipe, BlockScaling):
            qw = quantize_blockwise(w, fmt, (recipe.block, recipe.block), recipe.power_2_scale)
        elif isinstance(recipe, MXFP8):
            qw = quantize_mx(w, fmt, recipe.block_size, recipe.scale_rounding)
        else:
            qw = quantize_tensorwise(w, fmt, scale_from_amax(amax(w), fmt.max, recipe.margin))
        del self.weight
        self.register_buffer("weight", qw.data)
        self.register_buffer("weight_scale_inv", qw.scale_inv)
        self.weight_block = qw.block
        self.fp8_inference = True
        if self.bias is not None:
            self.bias.requires_grad_(False)
        return self

    def _inference_forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("FP8Linear with frozen FP8 weights is inference-only; run it under torch.no_grad()")
        recipe = self.fp8_recipe
        fmt = recipe.fp8_format.fwd
        x2, m = self._rows(x, recipe)
        qw = QuantizedTensor(self.weight, self.weight_scale_inv, fmt, self.weight_block)
        qx = self._quantize(x2, _IN, fmt, recipe, "act")
        y = fp8_gemm(qx, qw, torch.float32, _path(x.device.type, x.device.index, recipe))
        if self.bias is not None:
            y = y + self.bias.float()
        out_dtype = _out_dtype(x)
        return y[:m].to(out_dtype).reshape(*x.shape[:-1], self.out_features)


_BAD_AMAX_LOGGED: set[str] = set()


def reset_bad_amax_log() -> None:
    """Let :func:`check_bad_amax` log the next zero and the next non-finite amax again.

    It logs each kind once per process, so that a long run is not flooded; a new run started in the same
    process (a sweep's next trial, a notebook) calls this to have its own first bad amax reported.
    """
    _BAD_AMAX_LOGGED.clear()


@torch.no_grad()
def check_bad_amax(modules: list[FP8Linear]) -> None:
    """After an update round: log the first skipped (0 / non-finite) amax once, and raise
    :class:`mmte.errors.RunError` when a tensor's consecutive non-finite updates reach its recipe's
    ``max_bad_amax_steps`` (one host sync for all modules)."""
    mods = [m for m in modules if isinstance(m, FP8Linear) and isinstance(m.fp8_recipe, DelayedScaling) and hasattr(m, "fp8_bad_amax")]
    if not mods:
        return
    def local(t: torch.Tensor) -> torch.Tensor:  # TP turns the buffers into (replicated) DTensors
        return t.to_local() if hasattr(t, "to_local") else t

    counts = torch.stack([local(m.fp8_bad_amax) for m in mods])  # [M, 2, 3]
    run, total = (int(v) for v in counts.amax(dim=(0, 2)).tolist())
    if total == 0:
        return
    if run > 0 and "nonfinite" not in _BAD_AMAX_LOGGED:
        _BAD_AMAX_LOGGED.add("nonfinite")
        logger.warning("FP8 delayed scaling: a non-finite amax (inf/NaN); the previous scale was kept and the step counted "
                       "(training stops after max_bad_amax_steps in a row)")
    elif "zero" not in _BAD_AMAX_LOGGED and run == 0:
        _BAD_AMAX_LOGGED.add("zero")
        logger.info("FP8 delayed scaling: an amax of 0 (an all-zero tensor); the previous scale was kept")
    if run == 0:
        return
    for m, c in zip(mods, counts):
        limit = m.fp8_recipe.max_bad_amax_steps
        worst = int(c[0].max())
        if limit and worst >= limit:
            from ..errors import RunError

            role = ROLES[int(c[0].argmax())]
            raise RunError(
                f"FP8 delayed scaling saw a non-finite amax (inf/NaN) in {worst} consecutive updates of the {role} of "
                f"FP8Linear({m.in_features}, {m.out_features}) (scale kept at {float(local(m.fp8_scale)[ROLES.index(role)]):.4g})",
                "expected finite activations and gradients (the model or the loss has diverged)",
                "lower --model.lr or check the data; to tolerate more, raise max_bad_amax_steps in the precision fragment's recipe_args",
            )
