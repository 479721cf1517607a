"""A Lightning accelerator for Moore Threads MUSA GPUs (``accelerator: musa`` in YAML).

``torch_musa`` registers the ``musa`` device type and ``torch.musa`` (a mirror of ``torch.cuda``). The
accelerator is registered with Lightning's registry only when ``torch_musa`` imports; everything that
touches the device goes through :mod:`mmte.device`, so the device-index logic here is plain Python and
tested without the hardware. Unverified on real MUSA hardware (none was available).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry

from .. import device as mdevice

logger = logging.getLogger(__name__)

__all__ = ["MUSAAccelerator", "parse_musa_devices", "register_musa"]


def _count() -> int:
    mod = mdevice.backend_module("musa")
    return int(mod.device_count()) if mod is not None and mod.is_available() else 0


def parse_musa_devices(devices: int | str | list[int] | tuple[int, ...], available: int | None = None) -> list[int]:
    """Device indices from Lightning's ``devices`` argument.

    Args:
        devices: ``-1`` / ``"auto"`` / ``"-1"`` (all), an int ``n`` (the first n), ``"0,2"``, or a list.
        available: how many MUSA devices exist (default: ask ``torch.musa``).

    Raises:
        ValueError: naming the request and what is available.
    """
    n = _count() if available is None else available
    if isinstance(devices, str):
        s = devices.strip()
        if s in ("auto", "-1"):
            devices = -1
        elif "," in s or s.startswith("["):
            devices = [int(t) for t in s.strip("[]").split(",") if t.strip()]
        else:
            try:
                devices = int(s)
            except ValueError:
                raise ValueError(f"devices must be an int, a list of indices, '0,1' or 'auto'; got {devices!r}") from None
    if isinstance(devices, bool):
        raise TypeError(f"devices must be an int or a list of indices; got {devices!r}")
    if isinstance(devices, int):
        if devices == -1:
            ids = list(range(n))
        elif devices < 0:
            raise ValueError(f"devices must be >= 0 or -1 (all); got {devices}")
        else:
            ids = list(range(devices))
    else:
        ids = [int(i) for i in devices]
    if not ids:
        raise ValueError(f"no MUSA device selected (devices={devices!r}, {n} available)")
    bad = [i for i in ids if i < 0 or i >= n]
    if bad:
        raise ValueError(f"MUSA device indices {bad} requested but only {n} MUSA device(s) are available")
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate MUSA device indices in {ids}")
    return ids


class MUSAAccelerator(Accelerator):
    """Lightning accelerator for ``musa`` devices (process-group backend: ``mccl`` via :mod:`mmte.device`)."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "musa":
            raise ValueError(f"MUSAAccelerator needs a musa device; got {device}")
        mod = mdevice.backend_module("musa")
        if mod is None:
            raise RuntimeError("torch_musa is not importable: cannot set up a MUSA device")
        mod.set_device(device)

    def get_device_stats(self, device) -> dict[str, Any]:
        mod = mdevice.backend_module("musa")
        if mod is None or not hasattr(mod, "memory_stats"):
            return {}
        return dict(mod.memory_stats(device))

    def teardown(self) -> None:
        mod = mdevice.backend_module("musa")
        if mod is not None and hasattr(mod, "empty_cache"):
            mod.empty_cache()

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        return parse_musa_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("musa", i) for i in parse_musa_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return _count()

    @staticmethod
    def is_available() -> bool:
        return mdevice.is_available("musa")

    @staticmethod
    def name() -> str:
        return "musa"

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(cls.name(), cls, description="Moore Threads MUSA GPU (torch_musa)")


def register_musa(registry=None, *, force: bool = False) -> bool:
    """Register ``musa`` with Lightning's accelerator registry when ``torch_musa`` imports (or ``force``).

    Returns:
        whether the accelerator is (now) registered.
    """
    registry = AcceleratorRegistry if registry is None else registry
    if "musa" in registry:
        return True
    if not force and mdevice._musa_module() is None:
        return False
    MUSAAccelerator.register_accelerators(registry)
    logger.info("registered the MUSA accelerator with Lightning")
    return True


register_musa()
