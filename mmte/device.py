"""One API over the devices mmte runs on: CPU, NVIDIA CUDA and Moore Threads MUSA.

No other module calls ``torch.cuda`` / ``torch.musa`` directly; they ask this module. MUSA support
comes from ``torch_musa`` (which registers ``torch.musa`` and the ``musa`` device type when imported).
It is import-guarded: on machines without it, every MUSA branch reports "not available".
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass

import torch

__all__ = [
    "DeviceInfo",
    "autocast_dtypes",
    "available_types",
    "default_device",
    "dist_backend",
    "info",
    "is_available",
    "manual_seed",
    "max_memory_allocated",
    "memory_allocated",
    "reset_peak_memory_stats",
    "synchronize",
]

_DIST_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "musa": "mccl"}


@functools.cache
def _musa_module():
    """``torch.musa`` after importing ``torch_musa``, or None when it is not installed."""
    if importlib.util.find_spec("torch_musa") is None:
        return None
    try:
        import torch_musa  # noqa: F401  (registers torch.musa)
    except Exception:  # pragma: no cover - depends on a MUSA machine
        return None
    return getattr(torch, "musa", None)


def _backend_module(device_type: str):
    if device_type == "cuda":
        return torch.cuda
    if device_type == "musa":
        return _musa_module()
    return None


def _type(device: str | torch.device | None) -> str:
    if device is None:
        return default_device().type
    if isinstance(device, str):  # "musa" is not a torch.device string until torch_musa is imported
        return device.split(":")[0]
    return torch.device(device).type


def is_available(device_type: str) -> bool:
    """Whether ``device_type`` ("cpu", "cuda", "musa") has at least one usable device here."""
    if device_type == "cpu":
        return True
    if device_type not in _DIST_BACKENDS:
        raise ValueError(f"unknown device type {device_type!r}; expected one of {sorted(_DIST_BACKENDS)}")
    mod = _backend_module(device_type)
    return bool(mod is not None and mod.is_available())


def available_types() -> list[str]:
    """Device types usable on this machine, most capable first (e.g. ``["cuda", "cpu"]``)."""
    return [t for t in ("cuda", "musa") if is_available(t)] + ["cpu"]


def default_device() -> torch.device:
    """The first accelerator found (CUDA, then MUSA), else the CPU."""
    return torch.device(available_types()[0])


def dist_backend(device: str | torch.device | None = None) -> str:
    """The torch.distributed backend for a device type: gloo (cpu), nccl (cuda), mccl (musa)."""
    t = _type(device)
    if t not in _DIST_BACKENDS:
        raise ValueError(f"no distributed backend known for device type {t!r}; expected one of {sorted(_DIST_BACKENDS)}")
    return _DIST_BACKENDS[t]


def autocast_dtypes(device: str | torch.device | None = None) -> list[torch.dtype]:
    """Low-precision dtypes that ``torch.autocast`` supports on this device."""
    t = _type(device)
    if t == "cpu":
        return [torch.bfloat16, torch.float16]
    if t == "cuda":
        if not torch.cuda.is_available():
            return []
        return [torch.bfloat16, torch.float16] if torch.cuda.is_bf16_supported() else [torch.float16]
    if t == "musa":
        return [torch.bfloat16, torch.float16] if is_available("musa") else []
    return []


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    mod = _backend_module(_type(device))
    if mod is not None and mod.is_available():
        mod.synchronize()


def memory_allocated(device: str | torch.device | None = None) -> int:
    """Bytes currently allocated by the framework on the device (0 on the CPU: not tracked)."""
    mod = _backend_module(_type(device))
    return int(mod.memory_allocated()) if mod is not None and mod.is_available() else 0


def max_memory_allocated(device: str | torch.device | None = None) -> int:
    """Peak bytes allocated since the last reset (0 on the CPU: use bench tools' RSS instead)."""
    mod = _backend_module(_type(device))
    return int(mod.max_memory_allocated()) if mod is not None and mod.is_available() else 0


def reset_peak_memory_stats(device: str | torch.device | None = None) -> None:
    mod = _backend_module(_type(device))
    if mod is not None and mod.is_available():
        mod.reset_peak_memory_stats()


def manual_seed(seed: int) -> None:
    """Seed the CPU and every accelerator generator."""
    torch.manual_seed(seed)
    for t in ("cuda", "musa"):
        mod = _backend_module(t)
        if mod is not None and mod.is_available():
            mod.manual_seed_all(seed)


@dataclass(frozen=True)
class DeviceInfo:
    type: str
    name: str
    count: int
    capability: tuple[int, int] | None
    dist_backend: str
    autocast_dtypes: tuple[torch.dtype, ...]


def info(device: str | torch.device | None = None) -> DeviceInfo:
    """A summary of the device: name, count, compute capability (CUDA), backend, autocast dtypes."""
    t = _type(device)
    mod = _backend_module(t)
    if t == "cpu" or mod is None or not mod.is_available():
        import platform

        name, count, cap = platform.processor() or platform.machine(), 1, None
    else:
        name = mod.get_device_name()
        count = mod.device_count()
        cap = tuple(mod.get_device_capability()) if hasattr(mod, "get_device_capability") else None
    return DeviceInfo(t, name, count, cap, dist_backend(t), tuple(autocast_dtypes(t)))


@contextlib.contextmanager
def autocast(device: str | torch.device | None, dtype: torch.dtype | None):
    """``torch.autocast`` for ``device``; a no-op when ``dtype`` is None or float32."""
    if dtype is None or dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=_type(device), dtype=dtype):
        yield
