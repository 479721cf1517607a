"""Run a function in N gloo processes on the CPU (free port, OMP_NUM_THREADS=1, hard timeout).

The processes come from multiprocessing's fork server with torch, Lightning and mmte imported once
(:func:`start_method`): each process starts in milliseconds instead of importing them again (7 CPU-seconds
a process), and, unlike a fork of the test process, from a process that has run nothing (no OpenMP or
gloo threads to inherit). The target function is still imported in the process by its module's name, as
with spawn.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time

import torch.multiprocessing as mp

#: imported once by the fork server, before any process is forked from it
PRELOAD = ["torch", "torch.distributed", "mmte.cli.app"]


def start_method() -> str:
    """``"forkserver"``, its server (started by the first process this test process starts) preloading
    :data:`PRELOAD` with ``OMP_NUM_THREADS=1``; for ``torch.multiprocessing.start_processes``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    multiprocessing.set_forkserver_preload(PRELOAD)
    return "forkserver"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world, *args)
    except BaseException:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    # success: every rank has finished its sends and receives before the group goes, and the process ends
    # without running C++ destructors of gloo's worker threads (they aborted a finished pipeline run at
    # interpreter exit, "terminate called without an active exception", once in a loaded CI run)
    dist.barrier()
    dist.destroy_process_group()
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(fn, world: int, *args, timeout: float = 240.0) -> None:
    """Start ``fn(rank, world, *args)`` in ``world`` processes; re-raise the first failure."""
    ctx = mp.start_processes(_entry, args=(fn, world, free_port(), args), nprocs=world, join=False, start_method=start_method())
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"distributed job {fn.__name__} on {world} processes exceeded {timeout:.0f} s")
