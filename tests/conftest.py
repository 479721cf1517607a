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
