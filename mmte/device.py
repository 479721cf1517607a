"""One API over the devices mmte runs on: CPU, NVIDIA CUDA and Moore Threads MUSA.

No other module calls ``torch.cuda`` / ``torch.musa`` directly; they ask this module. MUSA support
comes from ``torch_musa`` (which registers ``torch.musa`` and the ``musa`` device type when imported).
It is import-guarded: on machines without it, every MUSA branch reports "not available".

CPUs differ more than their names suggest: one with AVX-512 BF16 (or AMX) runs bf16 GEMMs about twice
as fast as fp32, while an AVX2-only one emulates bf16 and runs it an order of magnitude slower.
:func:`cpu_info` reads what this CPU has (torch's dispatch capability and ``/proc/cpuinfo``'s flags
and core topology, no subprocess) and :func:`choose_precision` turns it into the precision a run
should use, with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
from dataclasses import dataclass

import torch

__all__ = [
    "BF16_FLAGS",
    "CPUInfo",
    "DeviceInfo",
    "autocast_dtypes",
    "available_types",
    "backend_module",
    "choose_precision",
    "cpu_info",
    "default_device",
    "describe",
    "dist_backend",
    "info",
    "is_available",
    "manual_seed",
    "max_memory_allocated",
    "memory_allocated",
    "parse_cpuinfo",
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
    except Exception:  # noqa: BLE001  # pragma: no cover - a broken torch_musa install raises anything; MUSA is then unavailable
        return None
    return getattr(torch, "musa", None)


def backend_module(device_type: str):
    """torch's module for an accelerator type: ``torch.cuda`` for ``"cuda"``, ``torch.musa`` for ``"musa"``
    (importing ``torch_musa``), None for the CPU or a backend that is not installed. The one place the
    device functions here (and the MUSA accelerator) get a backend from; whether it has a device is its
    ``is_available()``."""
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
    mod = backend_module(device_type)
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
    mod = backend_module(_type(device))
    if mod is not None and mod.is_available():
        mod.synchronize()


def memory_allocated(device: str | torch.device | None = None) -> int:
    """Bytes currently allocated by the framework on the device (0 on the CPU: not tracked)."""
    mod = backend_module(_type(device))
    return int(mod.memory_allocated()) if mod is not None and mod.is_available() else 0


def max_memory_allocated(device: str | torch.device | None = None) -> int:
    """Peak bytes allocated since the last reset (0 on the CPU: use bench tools' RSS instead)."""
    mod = backend_module(_type(device))
    return int(mod.max_memory_allocated()) if mod is not None and mod.is_available() else 0


def reset_peak_memory_stats(device: str | torch.device | None = None) -> None:
    mod = backend_module(_type(device))
    if mod is not None and mod.is_available():
        mod.reset_peak_memory_stats()


def manual_seed(seed: int) -> None:
    """Seed the CPU and every accelerator generator."""
    torch.manual_seed(seed)
    for t in ("cuda", "musa"):
        mod = backend_module(t)
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
    mod = backend_module(t)
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


# --------------------------------------------------------------------------------- CPU capabilities
#: cpuinfo flags that mean native bf16 arithmetic (AVX-512 BF16 dot products, AMX tiles).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: the flags worth reporting: what decides the speed of fp32 / bf16 / int8 GEMMs.
_REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


@dataclass(frozen=True)
class CPUInfo:
    """What this CPU can do, as far as mmte's choices go.

    Attributes:
        model: the model name (``/proc/cpuinfo``'s ``model name``; ``platform.processor()`` elsewhere).
        capability: torch's CPU dispatch level (``torch.backends.cpu.get_cpu_capability()``: ``"AVX512"``,
            ``"AVX2"``, ``"DEFAULT"``, ...).
        flags: the reported subset of the CPU flags (see ``_REPORTED_FLAGS``), sorted.
        logical_cores: processors this process may run on (its affinity mask).
        physical_cores: distinct cores among them (hyper-threads counted once).
    """

    model: str
    capability: str
    flags: tuple[str, ...]
    logical_cores: int
    physical_cores: int

    @property
    def bf16(self) -> bool:
        """Native bf16 arithmetic: AVX-512 BF16 or AMX-BF16."""
        return any(f in self.flags for f in BF16_FLAGS)

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags and "amx_tile" in self.flags

    @property
    def isa(self) -> str:
        """The best matrix instruction set: ``"amx"``, ``"avx512_bf16"``, ``"avx512"``, ``"avx2"`` or ``"plain"``."""
        if self.amx:
            return "amx"
        if "avx512_bf16" in self.flags:
            return "avx512_bf16"
        if "avx512f" in self.flags or self.capability.startswith("AVX512"):
            return "avx512"
        if "avx2" in self.flags or self.capability == "AVX2":
            return "avx2"
        return "plain"


def parse_cpuinfo(text: str, allowed: set[int] | None = None) -> tuple[str, set[str], int | None]:
    """``(model name, flags, physical cores)`` from the text of ``/proc/cpuinfo``.

    Physical cores are the distinct ``(physical id, core id)`` pairs of the processors in ``allowed``
    (all of them when None); None when the file has no topology (some VMs, non-x86 kernels).
    """
    model, flags, cores = "", set(), set()
    cpu = phys = core = None
    for line in text.splitlines() + [""]:
        if not line.strip():  # end of one processor's block
            if core is not None and (allowed is None or cpu in allowed):
                cores.add((phys, core))
            cpu = phys = core = None
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "processor" and value.isdigit():
            cpu = int(value)
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
    return model, flags, (len(cores) or None)


def _affinity() -> set[int]:
    """The processors this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return set(range(os.cpu_count() or 1))


@functools.cache
def cpu_info(path: str = "/proc/cpuinfo") -> CPUInfo:
    """This machine's :class:`CPUInfo` (cached; pass another ``path`` to read a saved cpuinfo file)."""
    text = ""
    with contextlib.suppress(OSError), open(path) as f:
        text = f.read()
    allowed = _affinity()
    # the cores of the processors this process may run on; a saved file describing other processors counts them all
    model, flags, physical = parse_cpuinfo(text, allowed)
    if physical is None:
        physical = parse_cpuinfo(text)[2]
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001  # pragma: no cover - very old torch
        capability = "unknown"
    logical = len(allowed)
    physical = min(physical or logical, logical)
    return CPUInfo(
        model=model or platform.processor() or platform.machine(),
        capability=capability,
        flags=tuple(sorted(f for f in flags if f in _REPORTED_FLAGS)),
        logical_cores=logical,
        physical_cores=max(1, physical),
    )


def choose_precision(device: str | torch.device | None = "cpu", cpu: CPUInfo | None = None) -> tuple[str, str]:
    """The Lightning precision ``precision: auto`` stands for on ``device``, and why.

    CPU: ``"bf16-mixed"`` when the CPU has native bf16 (AVX-512 BF16 or AMX), else ``"32-true"``
    (bf16 without those units is emulated and slower than fp32). CUDA/MUSA: ``"bf16-mixed"`` where
    the device supports bf16, else ``"32-true"``.

    Returns:
        ``(precision, reason)``.
    """
    t = _type(device)
    if t == "cpu":
        c = cpu or cpu_info()
        if c.bf16:
            native = [f for f in c.flags if f in BF16_FLAGS]
            return "bf16-mixed", f"the CPU has native bf16 ({', '.join(native)})"
        return "32-true", f"the CPU has no bf16 units (best: {c.isa}); bf16 would run slower than fp32"
    if torch.bfloat16 in autocast_dtypes(t):
        return "bf16-mixed", f"{t} supports bf16"
    return "32-true", f"{t} has no bf16 support"


def describe(cpu: CPUInfo | None = None, threads: int | None = None) -> str:
    """One line about the CPU: model, torch capability, the flags that matter, cores, threads."""
    c = cpu or cpu_info()
    threads = torch.get_num_threads() if threads is None else threads
    flags = ", ".join(c.flags) or "none of note"
    return (
        f"CPU {c.model} ({c.capability}; flags: {flags}; {c.physical_cores} physical / {c.logical_cores} logical cores), "
        f"{threads} torch threads"
    )
