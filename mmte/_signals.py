"""SIGINT / SIGTERM handling shared by the ``mmte`` command and :class:`mmte.training.guards.TrainingGuard`.

Outside a training loop a signal stops the command at once (:class:`mmte.errors.Interrupted`, exit
128 + signal). While a training loop runs (the guard calls :func:`defer`), the first signal is only
recorded: the guard sees it at the next step boundary, writes ``last.ckpt`` and stops; a second signal
stops at once. No lightning import here, so the command can install the handlers first thing.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

from .errors import Interrupted

__all__ = ["SIGNALS", "clear", "defer", "install", "install_cli_signal_handlers", "pending_signal"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    signum: int | None = None
    deferring: bool = False


_STATE = _State()


def _handler(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if _STATE.deferring and _STATE.signum is None:
        _STATE.signum = signum
        print(f"mmte: received {name}: saving a checkpoint at the end of this step, then stopping (send it again to stop at once)",
              file=sys.stderr, flush=True)
        return
    if _STATE.signum is not None:
        raise Interrupted(signum, f"interrupted by a second {name} before the checkpoint was written")
    raise Interrupted(signum, f"interrupted by {name} before training started (nothing to save)")


def install() -> Callable[[], None]:
    """Point SIGINT and SIGTERM at mmte's handler (main thread only); returns a function restoring the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)

    def restore() -> None:
        for s, h in old.items():
            if h is not None:
                signal.signal(s, h)

    return restore


def install_cli_signal_handlers() -> Callable[[], None]:
    """For ``mmte.cli.main``: install the handlers and forget any earlier signal; the returned function
    restores the previous handlers and clears the state."""
    clear()
    restore = install()

    def done() -> None:
        restore()
        clear()

    return done


def defer(on: bool) -> None:
    """Record signals instead of raising (a training loop checks :func:`pending_signal` at step boundaries)."""
    _STATE.deferring = bool(on)


def pending_signal() -> int | None:
    """The signal received while deferring, if any."""
    return _STATE.signum


def clear() -> None:
    _STATE.signum, _STATE.deferring = None, False
