"""Keep large CPU blocks in the heap for an ``mmte`` run (glibc only).

torch's CPU allocator takes every tensor from ``malloc``. glibc serves blocks above its mmap threshold
with a fresh ``mmap`` and returns them to the kernel on ``free``; the threshold adapts upwards only
after such a block is freed, and the heap's top is given back (trimmed) once 128 KiB of it is free. A
training step allocates and frees the same activations (megabytes each) every step, so the kernel
zeroes and maps their pages again every step (the profile of a ViT-S/16-shaped bf16 training step on a
2-core VM showed GELU and ``addmm``'s bias copy, the first writers of fresh activations, at 4-6x their
warm-memory time). With the settings below that step, alone in its process (model built once, as in
``mmte fit``), took a median 763-812 ms against 738-927 ms (three runs each; timm's under autocast
906-1063 vs 918-1150): ~7% on average on a noisy VM. Keeping freed blocks for reuse is what a caching
allocator (CUDA's, jemalloc, tcmalloc) does by design.

``mmte fit/validate/test/predict`` therefore call :func:`keep_heap` before building the Trainer: it
sets ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's maximum on 64-bit; larger blocks are still mapped) and
``M_TRIM_THRESHOLD`` to 1 GiB through ``mallopt``. The process then keeps up to its peak heap, as a
caching allocator does. It is left alone when:

* ``$MMTE_MALLOC`` is ``0``/``off``/``false``/``no`` (the opt-out);
* the user tuned glibc already (any ``MALLOC_*`` variable, e.g. ``MALLOC_MMAP_THRESHOLD_`` or
  ``MALLOC_ARENA_MAX``, or a ``glibc.malloc`` tunable in ``GLIBC_TUNABLES``);
* another allocator is preloaded (jemalloc, tcmalloc, mimalloc in ``LD_PRELOAD``);
* the C library is not glibc (macOS, Windows, musl) or has no ``mallopt``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys

logger = logging.getLogger("mmte")

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "heap_plan", "keep_heap"]

MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_applied: str | None = None


def heap_plan(environ: dict[str, str] | None = None, libc: str | None = None) -> str | None:
    """Why the allocator is left alone, or None when :func:`keep_heap` would tune it.

    Args:
        environ: the environment to read (default ``os.environ``).
        libc: the C library's name as ``platform.libc_ver()`` gives it (default: this process's).
    """
    env = os.environ if environ is None else environ
    if env.get("MMTE_MALLOC", "").strip().lower() in ("0", "off", "false", "no"):
        return "MMTE_MALLOC=" + env["MMTE_MALLOC"]
    user = sorted(v for v, val in env.items() if v.startswith("MALLOC_") and val.strip())
    if "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        return f"your {', '.join(user)}"
    preload = env.get("LD_PRELOAD", "").lower()
    other = next((a for a in _OTHER_ALLOCATORS if a in preload), None)
    if other:
        return f"{other} preloaded"
    if libc is None:
        libc = platform.libc_ver()[0] if sys.platform.startswith("linux") else sys.platform
    if libc != "glibc":
        return f"C library {libc or 'unknown'}, not glibc"
    return None


def keep_heap() -> str:
    """Apply the module's glibc settings once per process (see the module docstring); log one line per call.

    Returns:
        what was done, for the run header: ``"glibc heap kept (...)"`` or ``"left as is (reason)"``.
    """
    global _applied
    if _applied is not None:
        logger.info("CPU allocator: %s", _applied)
        return _applied
    why = heap_plan()
    if why is None:
        try:
            mallopt = ctypes.CDLL(None).mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            mmap_ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            trim_ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        except (AttributeError, OSError):
            why = "mallopt unavailable"
        else:
            if not (mmap_ok and trim_ok):  # mallopt returns 1 on success, 0 on a refused value
                why = "mallopt refused " + " and ".join(
                    n for n, ok in (("the mmap threshold", mmap_ok), ("the trim threshold", trim_ok)) if not ok
                ) + (" (the other was set)" if mmap_ok or trim_ok else "")
    _applied = ("left as is (" + why + ")") if why else (
        f"glibc heap kept (blocks up to {MMAP_THRESHOLD >> 20} MiB reused, trimmed above {TRIM_THRESHOLD >> 30} GiB free; MMTE_MALLOC=0 turns off)"
    )
    logger.info("CPU allocator: %s", _applied)
    return _applied
