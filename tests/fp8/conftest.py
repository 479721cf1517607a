import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The FP8 tests run many tiny ops: one intra-op thread avoids OpenMP spin-waiting on a shared CPU
    (measured 50x slower with 2 threads under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
