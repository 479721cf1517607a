"""The fit-family verbs (``fit``, ``validate``, ``test``, ``predict``): :class:`~mmte.cli.app.MMTECLI` after the
recipe checks of :mod:`mmte.cli.checks`."""

from __future__ import annotations

from ..errors import Interrupted
from .checks import LIGHTNING_COMMANDS, check_config_files

__all__ = ["LIGHTNING_COMMANDS", "run_lightning"]


def run_lightning(argv: list[str], from_sys: bool) -> int:
    """Run a fit-family verb (``argv[0]``) through :class:`~mmte.cli.app.MMTECLI`; returns the exit status.

    Args:
        argv: the command line after ``mmte``.
        from_sys: the arguments came from ``sys.argv`` (LightningCLI reads them there itself).

    A process group the run started is destroyed before returning, so its communication threads are joined
    here rather than torn down by the interpreter's exit (which can abort a finished torchrun rank).

    Raises:
        Interrupted: a signal arrived after the last step boundary (the final checkpoint is written).
    """
    import torch.distributed as dist

    from .._signals import pending_signal
    from .app import MMTECLI

    check_config_files(argv)
    had_group = dist.is_available() and dist.is_initialized()
    try:
        MMTECLI(args=None if from_sys else argv)
    finally:
        if not had_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    sig = pending_signal()
    if sig is not None:
        raise Interrupted(sig)
    return 0
