"""Callbacks that tests hand to ``mmte fit`` subprocesses by class path (``--trainer.callbacks+=
tests.training.callbacks.SignalAt``; the repository root is on the subprocess's ``PYTHONPATH``)."""

from __future__ import annotations

import json
import signal
import time

from lightning.pytorch import Callback


class SignalAt(Callback):
    """At global step ``step``: print ``MMTE-TEST step <n>`` (the test then sends a signal) and wait until a
    signal arrives, so the run stops at an exact step rather than wherever the signal happens to land. Each
    signal is noted, then handed to the handler mmte installed."""

    def __init__(self, step: int = 4):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        arrived = []

        def noting(mmte_handler):
            def note(signum, frame):
                arrived.append(signum)
                mmte_handler(signum, frame)
            return note

        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, noting(signal.getsignal(s)))
        print(f"MMTE-TEST step {trainer.global_step}", flush=True)
        t = time.monotonic()
        while not arrived and time.monotonic() - t < 120:
            time.sleep(0.01)


class SeenIds(Callback):
    """Write the ``index`` of every training item each epoch saw to ``<out>-<rank>.json``."""

    def __init__(self, out: str = "ids"):
        self.out, self.ids = out, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ids.setdefault(str(trainer.current_epoch), []).extend(int(i) for i in batch["index"])

    def on_train_end(self, trainer, pl_module):
        with open(f"{self.out}-{trainer.global_rank}.json", "w") as fh:
            json.dump(self.ids, fh)
