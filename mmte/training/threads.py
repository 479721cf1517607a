"""How many CPU threads torch's intra-op pool uses in an ``mmte`` run.

torch starts with one thread per *logical* CPU. On a machine with hyper-threads, or when several
processes share it (distributed ranks, other jobs), that oversubscribes the cores, and an OpenMP team
waiting on a descheduled thread stalls every op. ``mmte fit/validate/test/predict`` therefore set the pool
to the machine's *physical* cores (those this process may run on), split between the distributed
ranks on this machine, before the Trainer is built, and log the choice in the run's header.

Precedence: ``--threads N`` > ``$MMTE_THREADS`` > ``$OMP_NUM_THREADS`` (an explicit user setting)
> ``physical cores // local ranks`` (at least 1).
"""

from __future__ import annotations

import logging
import os

import torch

from ..device import cpu_info

logger = logging.getLogger("mmte")

__all__ = ["choose_threads", "local_ranks", "physical_cores", "set_threads"]


def physical_cores() -> int:
    """Physical CPU cores this process may run on (hyper-threads counted once), as
    :func:`mmte.device.cpu_info` reads them from ``/proc/cpuinfo`` and the affinity mask; elsewhere, the
    number of usable logical CPUs."""
    return cpu_info().physical_cores


def local_ranks(devices: object = None, accelerator: object = None) -> int:
    """Processes of this run on this machine: ``$LOCAL_WORLD_SIZE`` (torchrun / Lightning's launcher),
    else the Trainer's ``devices`` when it runs on the CPU (an int, a digit string or a list), else 1."""
    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    if str(accelerator or "auto") not in ("cpu", "auto") or (str(accelerator or "auto") == "auto" and torch.cuda.is_available()):
        return 1  # accelerator ranks use the CPU lightly; leave the split to the user
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, str) and devices.isdigit() and int(devices) > 0:
        return int(devices)
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    return 1


def _positive(value: object, what: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{what} must be a positive number of threads; got {value!r}")
    return n


def choose_threads(threads: int | None = None, ranks: int = 1) -> tuple[int, str]:
    """``(threads, reason)`` by the module's precedence.

    Raises:
        ValueError: ``threads`` / ``$MMTE_THREADS`` / ``$OMP_NUM_THREADS`` not a positive integer.
    """
    if threads is not None:
        return _positive(threads, "--threads"), "--threads"
    if os.environ.get("MMTE_THREADS", "").strip():
        return _positive(os.environ["MMTE_THREADS"], "MMTE_THREADS"), "MMTE_THREADS"
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return _positive(os.environ["OMP_NUM_THREADS"], "OMP_NUM_THREADS"), "OMP_NUM_THREADS"
    cores = physical_cores()
    n = max(1, cores // max(1, ranks))
    return n, f"{cores} physical core{'s' * (cores != 1)} / {ranks} local rank{'s' * (ranks != 1)}"


def set_threads(threads: int | None = None, devices: object = None, accelerator: object = None) -> int:
    """Set torch's intra-op threads for this process (see the module docstring); logs one line.

    Returns:
        the number of threads set.
    """
    ranks = local_ranks(devices, accelerator)
    n, why = choose_threads(threads, ranks)
    torch.set_num_threads(n)
    logger.info("torch threads: %d (%s; --threads N or MMTE_THREADS overrides)", n, why)
    return n
