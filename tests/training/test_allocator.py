"""mmte.training.allocator: when glibc's heap is kept, and that it takes effect (a fresh process each)."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from mmte.training.allocator import heap_plan

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.parametrize(
    ("environ", "libc", "expected"),
    [
        ({}, "glibc", None),
        ({"MMTE_MALLOC": "1"}, "glibc", None),
        ({"MMTE_MALLOC": "0"}, "glibc", "MMTE_MALLOC=0"),
        ({"MMTE_MALLOC": "off"}, "glibc", "MMTE_MALLOC=off"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "glibc", "your MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TOP_PAD_": "1"}, "glibc", "your MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_"),
        ({"MALLOC_ARENA_MAX": "2", "MALLOC_EMPTY": " "}, "glibc", "your MALLOC_ARENA_MAX"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "glibc", "your GLIBC_TUNABLES"),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, "glibc", None),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "glibc", "jemalloc preloaded"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "glibc", "tcmalloc preloaded"),
        ({}, "", "C library unknown, not glibc"),
        ({}, "darwin", "C library darwin, not glibc"),
    ],
)
def test_heap_plan(environ, libc, expected):
    assert heap_plan(environ, libc) == expected


_PROBE = """
import ctypes, json, sys
import torch
from mmte.training.allocator import keep_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
said = keep_heap() if sys.argv[1] == "keep" else "not called"
before = libc.mallinfo2()
x = torch.empty(2 << 20, dtype=torch.float32)  # 8 MiB: above glibc's default mmap threshold (128 KiB)
mapped = libc.mallinfo2().hblkhd - before.hblkhd
del x
in_heap_after_free = libc.mallinfo2().fordblks - before.fordblks
print(json.dumps({"said": said, "mapped": mapped, "free_in_heap": in_heap_after_free}))
"""


def _probe(mode: str, **env: str) -> dict:
    import json

    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MMTE_MALLOC"} | env
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=environ, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc with mallinfo2 only")
def test_keep_heap_serves_and_keeps_large_blocks_from_the_heap():
    default = _probe("default")
    kept = _probe("keep")
    # glibc's defaults: the 8 MiB tensor is its own mmap, returned to the kernel on free
    # (each figure is the change over the allocation: free heap chunks may serve a few KiB of it)
    assert default["mapped"] >= 8 << 20
    assert default["free_in_heap"] < 1 << 20
    # kept: it comes from the heap, and stays there (free, reusable without new page faults) after del
    assert kept["said"].startswith("glibc heap kept (blocks up to 32 MiB reused, trimmed above 1 GiB free")
    assert kept["mapped"] < 1 << 20
    assert kept["free_in_heap"] >= 7 << 20
    off = _probe("keep", MMTE_MALLOC="0")
    assert off["said"] == "left as is (MMTE_MALLOC=0)"
    assert off["mapped"] >= 8 << 20


def test_keep_heap_reports_a_refused_setting(monkeypatch, caplog):
    """mallopt answers 0 for a value it refuses: the run header says which setting did not take."""
    import logging

    from mmte.training import allocator

    calls = []

    class Libc:
        @staticmethod
        def mallopt(param, value):
            calls.append((param, value))
            return 0 if param == -1 else 1  # M_TRIM_THRESHOLD refused

    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "heap_plan", lambda: None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Libc())
    with caplog.at_level(logging.INFO, logger="mmte"):
        said = allocator.keep_heap()
    assert calls == [(-3, 32 << 20), (-1, 1 << 30)]
    assert said == "left as is (mallopt refused the trim threshold (the other was set))"
    assert "CPU allocator: left as is (mallopt refused the trim threshold (the other was set))" in caplog.text
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: object())  # no mallopt symbol
    assert allocator.keep_heap() == "left as is (mallopt unavailable)"
