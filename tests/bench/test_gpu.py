"""bench/gpu.py never ran on a GPU here: its argument parsing and its CPU path (measure nothing, say
why, write the reason, exit 0 or 1 with --require-gpu) are what a CPU machine can check."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def gpu_bench():
    from tests.conftest import load_bench

    return load_bench("gpu")


def test_arguments(gpu_bench, capsys):
    a = gpu_bench.parse_args([])
    assert (a.sections, a.shape, a.batch, a.budget_s) == (["train", "fp8", "kernels"], "vit-b16", 32, 420.0)
    a = gpu_bench.parse_args(["--sections", "train,kernels", "--shape", "vit-s16", "--batch", "8"])
    assert (a.sections, a.shape, a.batch) == (["train", "kernels"], "vit-s16", 8)
    with pytest.raises(SystemExit) as e:
        gpu_bench.parse_args(["--sections", "train,int4"])
    assert e.value.code == 2
    assert "error: unknown sections ['int4']; choose from ['train', 'fp8', 'kernels']" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_cpu_machine_measures_nothing_and_says_why(gpu_bench, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(["--json", str(out)]) == 0
    why = "no CUDA device here (torch.cuda.is_available() is False): nothing measured"
    assert capsys.readouterr().out.strip() == f"bench/gpu.py: {why}"
    assert json.loads(out.read_text()) == {"skipped": why, "sections": ["train", "fp8", "kernels"]}
    assert gpu_bench.main(["--json", str(out), "--require-gpu"]) == 1
    assert gpu_bench.gpu_skip_reason("cpu") == "--device cpu: this benchmark is for CUDA GPUs"
