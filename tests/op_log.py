"""``OpLog``: a record of the aten ops a block of code runs, for tests that check which kernels a path
uses (a GEMM really in bf16, a packed GEMM instead of ``addmm``, a patch GEMM instead of a convolution).
Shared by tests/te, tests/tokenizers and tests/inference."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    """Records (op name, input dtypes, input shapes) of every aten op that runs."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        self.ops.append((func.overloadpacket.__name__, tuple(t.dtype for t in ts), tuple(tuple(t.shape) for t in ts)))
        return func(*args, **(kwargs or {}))
