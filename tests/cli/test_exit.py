"""The console command's fast exit (mmte.cli._exit): atexit handlers, threads and streams are finished first, the exit
status is the command's, and MMTE_FAST_EXIT=0 keeps the ordinary exit; mmte.cli.main([...]) from Python returns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
sys.argv = ["mmte"] + sys.argv[1:]
from mmte.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("args, code", [(["--version"], 0), (["no-such-verb"], 2)])
def test_console_exit_finishes_handlers_and_keeps_the_status(fast, args, code):
    p = subprocess.run([sys.executable, "-c", SCRIPT, *args], env=dict(os.environ, MMTE_FAST_EXIT=fast), capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == code, p.stderr[-500:]
    assert "thread done" in p.stdout and "atexit ran" in p.stdout
    assert p.stdout.index("thread done") < p.stdout.index("atexit ran")


def test_main_called_from_python_returns():
    from mmte.cli import main

    assert main(["--version"]) == 0  # still in this process
