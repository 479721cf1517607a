import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def in_ci() -> bool:
    """True under CI (``.ci/run`` sets ``CI=true``), where missing data is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def load_bench(name: str):
    """A script of ``bench/`` (``bench/<name>.py``) imported as a module, for testing its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def need_data(path: Path, what: str) -> Path:
    """``path`` if it exists; otherwise skip the calling test (a developer's checkout without ../shared/data),
    or fail it under CI, where the data must be there."""
    path = Path(path)
    if path.exists():
        return path.resolve()
    msg = f"{what} not found at {path} (see ../shared/data/README.md)"
    if in_ci():
        pytest.fail(f"{msg}; CI=true, so this is a failure, not a skip")
    pytest.skip(msg)


@pytest.fixture
def shared_data() -> Path:
    return need_data(SHARED_DATA, "the shared data folder")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# ------------------------------------------------------------------ running the suite in parallel
# pyproject's addopts run the suite on pytest-xdist workers (one per core, at most 4), a test file per
# worker at a time (``--dist loadfile``: a file's module fixtures are built once). Two things make that
# faster rather than slower on a small machine:
#  * each worker, and every process a test starts from it (``mmte fit`` subprocesses, distributed ranks),
#    gets cores // workers torch threads, so workers never oversubscribe the cores (an OpenMP team that
#    waits on a descheduled thread turns a millisecond op into a time slice);
#  * the files are handed out longest first (their measured seconds: tests/file_durations.py), so the
#    longest file is not the last one started.
# ``-n 0`` (or ``-p no:xdist``) runs everything in this process, e.g. for a single test.
def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and os.environ.get("PYTEST_XDIST_WORKER"):
        from mmte.training.threads import physical_cores

        per = str(max(1, physical_cores() // int(workers)))
        for var in ("OMP_NUM_THREADS", "MMTE_THREADS"):
            os.environ.setdefault(var, per)
        torch.set_num_threads(int(os.environ["MMTE_THREADS"]))


def pytest_collection_modifyitems(config, items):
    from tests.file_durations import order

    order(items, REPO)
