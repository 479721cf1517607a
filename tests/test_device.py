import json
import os
from pathlib import Path

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
    assert device.backend_module("musa") is None


def test_backend_module_is_torchs_module_for_the_type():
    assert device.backend_module("cuda") is torch.cuda
    assert device.backend_module("cpu") is None


def test_info_and_memory_api_on_cpu():
    info = device.info("cpu")
    assert info.type == "cpu" and info.dist_backend == "gloo" and info.count == 1
    device.synchronize("cpu")
    device.reset_peak_memory_stats("cpu")
    assert device.memory_allocated("cpu") == 0 and device.max_memory_allocated("cpu") == 0


def test_manual_seed_seeds_cpu_and_every_accelerator(monkeypatch):
    """The CPU stream equals a fresh generator seeded alike (and differs for another seed); each available
    accelerator backend gets manual_seed_all(seed), an unavailable one nothing."""
    calls = []

    class FakeBackend:
        def __init__(self, name, available):
            self.name, self.available = name, available

        def is_available(self):
            return self.available

        def manual_seed_all(self, seed):
            calls.append((self.name, seed))

    fakes = {"cuda": FakeBackend("cuda", True), "musa": FakeBackend("musa", False)}
    monkeypatch.setattr(device, "backend_module", lambda t: fakes.get(t))
    device.manual_seed(3)
    a = torch.rand(3)
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(4)))
    assert calls == [("cuda", 3)]


def test_unknown_device_type():
    with pytest.raises(ValueError, match="unknown device type 'tpu'"):
        device.is_available("tpu")
    with pytest.raises(ValueError, match="no distributed backend known for device type 'meta'"):
        device.dist_backend("meta")


# ------------------------------------------------------------------------------ CPU capabilities
def _cpuinfo(flags: str, cores: list[tuple[int, int]], model: str = "Test CPU") -> str:
    blocks = [
        f"processor\t: {i}\nvendor_id\t: Test\nmodel name\t: {model}\nphysical id\t: {p}\ncore id\t\t: {c}\nflags\t\t: {flags}\n"
        for i, (p, c) in enumerate(cores)
    ]
    return "\n".join(blocks)


AVX2 = "fpu sse sse2 avx fma avx2 f16c"
AVX512_BF16 = AVX2 + " avx512f avx512bw avx512_vnni avx512_bf16"
AMX = AVX512_BF16 + " amx_bf16 amx_tile amx_int8"


def test_parse_cpuinfo_counts_physical_cores_once():
    # 2 sockets x 2 cores x 2 hyper-threads = 8 processors, 4 physical cores
    text = _cpuinfo(AVX2, [(p, c) for p in (0, 1) for c in (0, 1) for _ in (0, 1)], model="Xeon Foo")
    model, flags, physical = device.parse_cpuinfo(text)
    assert model == "Xeon Foo"
    assert {"avx2", "fma"} <= flags and "avx512_bf16" not in flags
    assert physical == 4
    assert device.parse_cpuinfo("processor : 0\nflags : neon\n") == ("", {"neon"}, None)
    # only the processors this process may run on: 0-3 are the hyper-thread pairs of socket 0's two cores
    assert device.parse_cpuinfo(text, allowed={0, 1})[2] == 1
    assert device.parse_cpuinfo(text, allowed={0, 2, 4})[2] == 3


@pytest.mark.parametrize(
    ("flags", "capability", "isa", "bf16", "precision"),
    [
        (AVX2, "AVX2", "avx2", False, "32-true"),
        (AVX2 + " avx512f", "AVX512", "avx512", False, "32-true"),
        (AVX512_BF16, "AVX512", "avx512_bf16", True, "bf16-mixed"),
        (AMX, "AVX512", "amx", True, "bf16-mixed"),
        ("fpu sse sse2", "DEFAULT", "plain", False, "32-true"),
    ],
)
def test_auto_precision_follows_the_cpu(tmp_path, monkeypatch, flags, capability, isa, bf16, precision):
    path = tmp_path / "cpuinfo"
    path.write_text(_cpuinfo(flags, [(0, 0), (0, 1)]))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    info = device.cpu_info(str(path))
    assert (info.isa, info.bf16, info.physical_cores) == (isa, bf16, 2)
    chosen, why = device.choose_precision("cpu", info)
    assert chosen == precision
    # an AVX2-only CPU never gets bf16 (emulated there: slower than fp32), and the reason says so
    if not bf16:
        assert why == f"the CPU has no bf16 units (best: {isa}); bf16 would run slower than fp32"
    else:
        assert why.startswith("the CPU has native bf16 (") and ("amx_bf16" in why or "avx512_bf16" in why)
    from mmte.inference import resolve_dtype

    monkeypatch.setattr(device, "cpu_info", lambda path="/proc/cpuinfo": info)
    assert resolve_dtype("auto", "cpu") == ("bf16" if bf16 else "fp32")
    assert resolve_dtype("fp32", "cpu") == "fp32"


def test_this_cpu_matches_proc_cpuinfo():
    info = device.cpu_info()
    text = Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
    if "avx512_bf16" in text.split():
        assert info.bf16 and "avx512_bf16" in info.flags
    assert 1 <= info.physical_cores <= info.logical_cores <= (os.cpu_count() or 1)
    assert info.capability == str(torch.backends.cpu.get_cpu_capability())
    line = device.describe(info, threads=3)
    assert line.startswith(f"CPU {info.model} ({info.capability}; flags: ") and line.endswith(", 3 torch threads")


@pytest.mark.parametrize(
    "flags, cpu_flags, precision",
    [
        (("amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"), "amx_bf16, amx_tile, avx2, avx512_bf16, avx512f",
         "bf16-mixed (the CPU has native bf16 (amx_bf16, avx512_bf16))"),
        (("avx2", "fma"), "avx2, fma", "32-true (the CPU has no bf16 units (best: avx2); bf16 would run slower than fp32)"),
        ((), "none of note", "32-true (the CPU has no bf16 units (best: plain); bf16 would run slower than fp32)"),
    ],
    ids=["amx", "avx2", "plain"],
)
def test_mmte_env_and_version(capsys, monkeypatch, flags, cpu_flags, precision):
    """``mmte env`` reports the CPU it is given (a fixed one here, not this machine's) and the precision
    ``auto`` picks for it, written out."""
    from mmte import __version__
    from mmte.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"mmte {__version__}"
    cpu = device.CPUInfo("Test CPU", "DEFAULT", flags, 4, 2)
    monkeypatch.setattr(device, "cpu_info", lambda path="/proc/cpuinfo": cpu)
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["mmte"] == __version__ and env["torch"] == torch.__version__
    assert env["cpu"] == "Test CPU" and env["cores"].startswith("2 physical, 4 logical")
    assert env["cpu flags"] == cpu_flags
    assert env["torch threads"] == str(torch.get_num_threads())
    assert env["precision auto"] == precision
    for pkg in ("lightning", "timm", "onnxruntime"):
        assert pkg in env
    from mmte.inference.prepack import available

    want = " and ".join(n for n, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)) if available(dt))
    assert env["inference prepack"].startswith(want + " GEMM weights" if want else "unavailable")
    from mmte.inference.prepack import SMALL_ROWS, small_available

    small_on = available(torch.bfloat16) and small_available()
    assert env["inference small rows"].startswith(f"<= {SMALL_ROWS} rows" if small_on else "off (")
    assert main(["env"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["mmte", __version__]
