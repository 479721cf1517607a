"""Start ``tests/parallel/cli_fit.py`` over a list of ``mmte fit`` / ``predict`` argument lists: one launch of
one process, or of ``world`` ranks (torchrun's environment, forked after one import: ``cli_fit.py --world``),
for all of them (one start-up, many runs), and read back its JSON results. Shared by the multi-process test files of this folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def launch(world: int, runs: dict[str, list[str]], tmp: Path, timeout: int) -> dict:
    """Run ``cli_fit.py`` over ``runs`` in one launch of ``world`` processes; its JSON results.

    A launch in which a process died of a native abort (no Python error recorded by any run) is started
    once more from clean run folders, with a warning holding the dead process's stacks: such an abort was
    seen twice in CI under load (in the gloo/C++ layer, between or after runs) and never reproduced alone.
    A second abort, or any Python error, fails the test.
    """
    results, failure = launch_partial(world, runs, tmp, timeout)
    assert not failure, failure
    return results


def launch_partial(world: int, runs: dict[str, list[str]], tmp: Path, timeout: int) -> tuple[dict, str]:
    """As :func:`launch`, but a failed launch is returned, not raised: ``(results of the runs that finished,
    "" or why the launch failed)``, so that each test of a shared launch reports its own runs."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec, out = tmp / f"runs{world}.json", tmp / f"out{world}.json"
    spec.write_text(json.dumps(runs))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    script = str(REPO / "tests" / "parallel" / "cli_fit.py")
    cmd = [sys.executable, script, *(["--world", str(world)] if world > 1 else []), str(out), str(spec)]
    for attempt in (1, 2):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        errors = {k: v for f in tmp.glob(f"out{world}.json.error-*") for k, v in json.loads(f.read_text()).items()}
        if attempt == 1 and proc.returncode != 0 and not errors and native_abort(proc):
            warnings.warn(f"launch of {world} process(es) over {sorted(runs)} died of a native abort; started again:\n"
                          f"{proc.stderr[-4000:]}", stacklevel=2)
            out.unlink(missing_ok=True)
            for args in runs.values():
                if "--trainer.default_root_dir" in args:
                    shutil.rmtree(args[args.index("--trainer.default_root_dir") + 1], ignore_errors=True)
            continue
        break
    results = json.loads(out.read_text()) if out.exists() else {}
    if proc.returncode == 0 and out.exists() and not errors:
        return results, ""
    return {**results, **errors}, f"launch of {world} process(es) failed (exit {proc.returncode}): {errors}\n{proc.stderr[-6000:]}"


def native_abort(proc: subprocess.CompletedProcess) -> bool:
    """Whether a launch ended because a process was killed by SIGABRT or SIGSEGV (torchrun and ``cli_fit.py --world`` report the
    rank's exit code as -6 / -11; one process ends with the negative code itself)."""
    if proc.returncode in (-6, -11):
        return True
    return any(f"exitcode  : {code} " in proc.stderr or f"(exitcode: {code})" in proc.stderr for code in (-6, -11))
