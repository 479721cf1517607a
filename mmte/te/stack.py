"""``TransformerStack``: the type that functions applied to a model look for.

FP8 conversion, tensor/pipeline parallelism, FSDP grouping and the inference cast act on "the
transformer trunk" of whatever model they are given. They find it by this engine-level type, not by
the backbone class that builds it (:class:`mmte.encoders.Backbone` subclasses it), so ``mmte.fp8``,
``mmte.parallel`` and ``mmte.inference`` depend on ``mmte.te`` alone.

The contract: ``layers`` is an ``nn.ModuleDict`` of transformer layers keyed ``"0".."L-1"`` (a
pipeline stage may hold a subset), each called as ``layer(x [B, N, D], mask [B, N] | None)``; and
``compute_dtype`` (a dtype or None) is the dtype the layers run in when set; ``small_rows`` (set by
``mmte.inference.optimize`` when every GEMM is packed for the CPU) is the largest input, in rows of batch
x tokens, that instead runs in fp32 on fp16-packed weights when no gradient is recorded (the small-row
path of :mod:`mmte.inference`), with torch's intra-op pool at one thread (:func:`one_thread`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["TransformerStack", "find_stacks", "one_thread"]


class TransformerStack(nn.Module):
    """Base class of transformer trunks: a ``layers`` ModuleDict keyed ``"0".."L-1"``.

    It owns no parameters of its own; subclasses build ``layers`` (and any norms) in ``__init__``.
    """

    layers: nn.ModuleDict
    compute_dtype: torch.dtype | None = None
    small_rows: int = 0


def find_stacks(model: nn.Module) -> list[tuple[str, TransformerStack]]:
    """``(fqn, module)`` of every :class:`TransformerStack` in ``model``, outermost only, in module order."""
    found: list[tuple[str, TransformerStack]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, TransformerStack) and not any(f == "" or name.startswith(f + ".") for f, _ in found):
            found.append((name, mod))
    return found


_pool_lock = threading.Lock()
_pool_users = 0
_pool_saved = 1


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with torch's intra-op pool at one thread (restored after).

    A stack's small-row inputs run this way: fbgemm's fp16-weight GEMM runs on the calling thread alone,
    and the other ops at that size (norms, attention over a few tokens) are too small to split, so
    waking more threads for each of them costs more than it saves. The thread count is process-wide,
    so callers on several Python threads (a threaded server) share one count: the first in saves it,
    the last out restores it; until then other work in the process also runs on one intra-op thread.
    """
    global _pool_users, _pool_saved
    with _pool_lock:
        if _pool_users == 0:
            _pool_saved = torch.get_num_threads()
            if _pool_saved != 1:
                torch.set_num_threads(1)
        _pool_users += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users -= 1
            if _pool_users == 0 and _pool_saved != 1:
                torch.set_num_threads(_pool_saved)
