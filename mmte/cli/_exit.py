"""The ``mmte`` console command's exit: end the process without the interpreter's module teardown.

Tearing down the modules Lightning pulls in (torch, torchmetrics, torchvision, sympy, ...) takes about a second
and a half on two cores after everything is written (BENCHMARKS.md's quickstart section has the measured
before/after). Everything a normal exit does that matters is done first: other non-daemon threads are joined,
``atexit`` handlers run (DataLoader workers, torch.distributed, loggers such as MLflow and W&B, temporary
files), logging handlers and the standard streams are flushed. The one switch ``MMTE_FAST_EXIT=0`` keeps the
ordinary exit. Only the console command uses it: ``mmte.cli.main([...])`` called from Python returns normally.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

__all__ = ["exit_now", "fast_exit_enabled"]


def fast_exit_enabled() -> bool:
    """Whether the console command ends with :func:`exit_now` (``MMTE_FAST_EXIT`` unset or not ``0``)."""
    return os.environ.get("MMTE_FAST_EXIT", "1") != "0"


def exit_now(code: int) -> None:
    """End the process with ``code`` after joining threads, running ``atexit`` handlers and flushing streams."""
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a vanished pipe: nothing left to write
            pass
    os._exit(code)
