"""One trial of ``mmte tune``: a real ``mmte fit`` process with the trial's values as flags.

The trial runs ``python -m mmte fit <the recipe and flags given to tune> --<key> <value> ...`` in its own
folder (``<out>/trials/<number>``: logs, checkpoints, ``fit.log`` with the process's output), with the
machine's cores split between the trials running at once (``--threads``) and
:class:`~mmte.tune.callback.OptunaPruning` appended to its callbacks. Only the training and
validation splits are read: ``fit`` never loads the test split.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .space import cli_value

__all__ = ["TrialProcesses", "fit_command", "last_error_line", "validate_command"]

_CALLBACK = "mmte.tune.callback.OptunaPruning"


def _callback_flag(init_args: Mapping[str, Any]) -> str:
    return "--trainer.callbacks+=" + json.dumps({"class_path": _CALLBACK, "init_args": dict(init_args)})


def fit_command(base: Sequence[str], values: Mapping[str, Any], folder: str, threads: int, monitor: str, storage: str, study: str, number: int) -> list[str]:
    """The ``mmte fit`` command line of trial ``number`` with ``values`` ({recipe key: value})."""
    cmd = [sys.executable, "-m", "mmte", "fit", *base]
    for key, value in values.items():
        cmd += [f"--{key}", cli_value(value)]
    cmd += ["--trainer.default_root_dir", folder, "--checkpoint.dirpath", os.path.join(folder, "checkpoints"), "--threads", str(threads),
            _callback_flag({"monitor": monitor, "storage": storage, "study": study, "trial": number})]
    return cmd


def validate_command(base: Sequence[str], values: Mapping[str, Any], folder: str, monitor: str) -> list[str]:
    """The pre-flight command: ``mmte validate`` on one validation batch with ``values``, checking that
    every key parses, the model builds and ``monitor`` is logged."""
    cmd = [sys.executable, "-m", "mmte", "validate", *base]
    for key, value in values.items():
        cmd += [f"--{key}", cli_value(value)]
    return cmd + ["--trainer.default_root_dir", folder, "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
                  "--trainer.enable_progress_bar", "false", _callback_flag({"monitor": monitor})]


def last_error_line(log: str) -> str | None:
    """The message of the last ``mmte: error:`` line of a trial's output (None when there is none)."""
    lines = [ln for ln in log.splitlines() if ln.startswith("mmte: error: ")]
    return lines[-1][len("mmte: error: "):] if lines else None


class TrialProcesses:
    """The running trial processes, so a signal to ``mmte tune`` reaches them (they save and stop)."""

    def __init__(self):
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopped: int | None = None  # the signal that stopped the study

    def run(self, cmd: list[str], log_path: str, env: Mapping[str, str] | None = None) -> int:
        """Run ``cmd`` with its output in ``log_path``; returns its exit status."""
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            with self._lock:
                if self.stopped is not None:
                    return 128 + self.stopped
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env) if env is not None else None)
                self._procs.add(proc)
            try:
                return proc.wait()
            finally:
                with self._lock:
                    self._procs.discard(proc)

    def forward(self, signum: int, frame: Any = None) -> None:
        """Signal handler: pass SIGINT/SIGTERM on to every running trial and start no new one."""
        with self._lock:
            self.stopped = signum
            for p in self._procs:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    def install(self):
        """Forward SIGINT and SIGTERM while the study runs; returns a function restoring the handlers."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {s: signal.signal(s, self.forward) for s in (signal.SIGINT, signal.SIGTERM)}
        return lambda: [signal.signal(s, h) for s, h in old.items()]
