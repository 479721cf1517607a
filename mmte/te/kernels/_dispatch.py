"""Where the Triton kernels can run, and the launch geometry they run with.

:func:`available` and :func:`dispatches_to_triton` decide between a kernel and the torch composition;
the tile helpers give each launch its block sizes and warps. Nothing here imports triton unless a
kernel could run (asking about a plain CPU tensor never does).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys

import torch

__all__ = [
    "IMPLS",
    "KERNEL_DTYPES",
    "MAX_HIDDEN",
    "act_tiles",
    "available",
    "cdiv",
    "device_guard",
    "dispatches_to_triton",
    "interpreter_mode",
    "norm_tiles",
    "reduction_split",
    "want_triton",
]

IMPLS = ("auto", "triton", "torch")
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HIDDEN = 8192  # widest row one program normalises in registers (wider ones would spill)


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def interpreter_mode() -> bool:
    """Whether triton was imported for its interpreter (it reads ``TRITON_INTERPRET`` at import: its own
    ``tl`` functions are then interpreted, and so must every kernel be)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.sum, InterpretedFunction)


@functools.cache
def _triton_import() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'mmte[triton]')"
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001  # pragma: no cover - a broken install raises anything; reported
        return False, f"triton does not import: {type(e).__name__}: {e}"
    return True, ""


def available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether the Triton kernels can run (on ``device`` when given); ``(False, reason)`` if not.

    Args:
        device: ``None`` asks only whether triton imports; a device also asks whether kernels can run
            on it (CUDA; the CPU only under ``TRITON_INTERPRET=1``).

    Returns:
        ``(True, "")`` or ``(False, reason)``.
    """
    if os.environ.get("MMTE_DISABLE_TRITON", "0") == "1":
        return False, "MMTE_DISABLE_TRITON=1"
    cpu_why = "Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (the interpreter)"
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu" and not _env_interpret() and "triton" not in sys.modules:
        return False, cpu_why  # without importing triton for nothing
    ok, why = _triton_import()
    if not ok or dev is None:
        return ok, why
    if interpreter_mode():
        return True, ""  # the interpreter runs kernels on CPU tensors (and, slowly, on CUDA ones)
    if _env_interpret():
        return False, ("TRITON_INTERPRET=1 was set after triton had been imported in this process; triton reads it at "
                       "import, so set it before anything imports triton")  # fmt: skip
    if dev.type == "cuda":
        return True, ""
    if dev.type == "cpu":
        return False, cpu_why
    return False, f"no Triton backend wired for device type {dev.type!r} (expected cuda, or cpu with TRITON_INTERPRET=1)"


def dispatches_to_triton(x: torch.Tensor, hidden: int | None = None) -> bool:
    """Whether ``impl="auto"`` runs the Triton kernel for ``x`` (else the torch composition).

    Inside a ``torch.compile`` region the composition runs: inductor fuses it itself.

    Args:
        x: the input activation.
        hidden: the normalised/feature size (defaults to ``x.shape[-1]``).
    """
    if torch.compiler.is_compiling() or x.dtype not in KERNEL_DTYPES or x.numel() == 0:
        return False
    if (hidden if hidden is not None else x.shape[-1]) > MAX_HIDDEN:
        return False
    return available(x.device)[0]


def want_triton(impl: str, x: torch.Tensor, *, whole_rows: bool, residual: torch.Tensor | None = None) -> bool:
    """Resolve ``impl`` for ``x``; ``whole_rows``: the kernel keeps a row in registers (the norms)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {list(IMPLS)}; got {impl!r}")
    if impl == "torch":
        return False
    r_ok = residual is None or residual.dtype in KERNEL_DTYPES
    if impl == "auto":
        return r_ok and dispatches_to_triton(x, None if whole_rows else 1)
    if x.dtype not in KERNEL_DTYPES or not r_ok:
        got = x.dtype if x.dtype not in KERNEL_DTYPES else residual.dtype
        raise TypeError(f"the Triton kernels take float32/float16/bfloat16 tensors; got {got}")
    if whole_rows and x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"the Triton kernels take rows of at most {MAX_HIDDEN} elements; got {x.shape[-1]}")
    ok, why = available(x.device)
    if not ok:
        raise RuntimeError(f"impl='triton' requested but the Triton kernels cannot run here: {why}")
    return True


def device_guard(t: torch.Tensor):
    """Make ``t``'s accelerator the current one while a kernel launches (Triton launches there)."""
    if t.device.type == "cpu" or t.device.index is None:
        return contextlib.nullcontext()
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "device_index"):
        return acc.device_index(t.device.index)
    return contextlib.nullcontext()  # pragma: no cover - torch < 2.7


@functools.cache
def _num_programs_for_reduction(device_type: str, index: int | None) -> int:
    """How many programs share a column reduction (2 per SM on a GPU; few in the interpreter)."""
    if device_type == "cpu":
        return 4
    try:
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(index or 0)
        return 2 * int(props["multiprocessor_count"])
    except (ImportError, AttributeError, KeyError, RuntimeError):  # pragma: no cover - depends on the GPU driver
        return 256


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def norm_tiles(D: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_D, num_warps) for a row length ``D``: whole rows, about 2048 elements a tile and
    8 a thread (16 at D = 8192), so that nothing spills to local memory up to D = 4096 on sm_90."""
    block_d = _next_pow2(D)
    block_m = max(1, min(16, 2048 // block_d))
    num_warps = min(16, max(4, block_m * block_d // 256))
    return block_m, block_d, num_warps


def act_tiles(N: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for the element-wise bias+activation kernels: tiles of at most
    8 x 256 (16 elements a thread at 4 warps)."""
    block_n = min(256, _next_pow2(N))
    return min(64, 2048 // block_n), block_n, 4


def reduction_split(M: int, block_m: int, device: torch.device) -> tuple[int, int]:
    """(programs, rows_per_program) for a backward that reduces over rows into partial sums."""
    g = min(cdiv(M, block_m), _num_programs_for_reduction(device.type, device.index))
    rows_per_prog = cdiv(cdiv(M, g), block_m) * block_m
    return cdiv(M, rows_per_prog), rows_per_prog
