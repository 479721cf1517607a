"""Logging for the ``mmte`` command: one ``mmte: <message>`` line per transformation applied, on stderr,
and exact filters for library messages a user can do nothing about."""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = ["setup_logging"]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (a handler bound to the stderr of its creation breaks when a
    caller, e.g. a test harness, swaps and closes it between commands)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging() -> None:
    """mmte's log lines on stderr as ``mmte: <message>``, library noise the user can do nothing about hidden."""
    mlog = logging.getLogger("mmte")
    # one line per transformation applied (DESIGN.md house style); a handler someone else attached
    # (a test capturing the lines, an application's own) does not replace ours
    if not any(isinstance(h, _StderrHandler) for h in mlog.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("mmte: %(message)s"))
        mlog.addHandler(h)
        mlog.propagate = False
    if mlog.level == logging.NOTSET:
        mlog.setLevel(logging.INFO)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)  # "Seed set to 0" on every command
    _quiet_library_noise()


#: Library messages a user of ``mmte`` can do nothing about: (category, message regex, module regex). Each is
#: hidden by an exact filter, so any other warning of the same libraries still shows.
_NOISE_WARNINGS = (
    # lightning 2.6 calls torch's deprecated isinstance(spec, LeafSpec) on every step
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    # the model summary's size estimate under bf16-mixed (mmte's precision: auto picks it)
    (UserWarning, r"Precision \S+ is not supported by the model summary", r"lightning\.pytorch\.utilities\.model_summary"),
    # epoch-level logs under data parallelism: mmte logs rank-local training losses (evaluation losses are averaged over ranks)
    (None, r"It is recommended to use `self\.log\('(train|val|test)_", r"lightning\.pytorch\.trainer\.connectors\.logger_connector\.result"),
    # torchdata's StatefulDataLoader calls torch's deprecated set_vital in its constructor
    (UserWarning, r"'set_vital' is deprecated", r"torchdata\.stateful_dataloader\.stateful_dataloader"),
)
#: (logger, message prefix) of library log records hidden the same way.
_NOISE_LOGS = (
    # torchao registers its Enums as pytree constants at import; torch 2.14 deprecates that (torchao's business)
    ("torch.utils._pytree", "<enum "),
    # Lightning's advertisement for its cloud logger
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging"),
)


class _DropMessages(logging.Filter):
    def __init__(self, prefix: str, contains: str = ""):
        super().__init__()
        self.prefix, self.contains = prefix, contains

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(self.prefix) and self.contains in msg)


def _quiet_library_noise() -> None:
    """Install the filters of :data:`_NOISE_WARNINGS` and :data:`_NOISE_LOGS` (once)."""
    for category, message, module in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category or Warning, module=module)
    for name, prefix in _NOISE_LOGS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) and f.prefix == prefix for f in log.filters):
            contains = "is an Enum subclass and is now natively supported" if name == "torch.utils._pytree" else ""
            log.addFilter(_DropMessages(prefix, contains))
