import pytest
import torch

from mmte import device


def test_cpu_always_available():
    assert device.is_available("cpu")
    assert device.available_types()[-1] == "cpu"
    assert device.dist_backend("cpu") == "gloo"
    assert device.dist_backend("cuda") == "nccl"
    assert device.dist_backend("musa") == "mccl"
    assert torch.bfloat16 in device.autocast_dtypes("cpu")


def test_musa_is_reported_unavailable_without_torch_musa():
    pytest.importorskip("torch")
    try:
        import torch_musa  # noqa: F401
        pytest.skip("torch_musa is installed")
    except ImportError:
        pass
    assert not device.is_available("musa")
    assert device.autocast_dtypes("musa") == []


def test_info_and_memory_api_on_cpu():
    info = device.info("cpu")
    assert info.type == "cpu" and info.dist_backend == "gloo" and info.count == 1
    device.synchronize("cpu")
    device.reset_peak_memory_stats("cpu")
    assert device.memory_allocated("cpu") == 0 and device.max_memory_allocated("cpu") == 0


def test_manual_seed_is_reproducible():
    device.manual_seed(3)
    a = torch.rand(3)
    device.manual_seed(3)
    assert torch.equal(a, torch.rand(3))


def test_unknown_device_type():
    with pytest.raises(ValueError, match="unknown device type 'tpu'"):
        device.is_available("tpu")
    with pytest.raises(ValueError, match="no distributed backend known for device type 'meta'"):
        device.dist_backend("meta")
