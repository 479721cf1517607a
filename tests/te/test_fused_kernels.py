"""Backbone(fused=True, fusion="kernels"): the hand-written Triton kernels inside a real layer stack equal
the eager path (fp32, rtol 1.3e-6 / atol 1e-5 forward, 1e-5 backward). The kernels run under Triton's
interpreter on CPU tensors, which must be switched on before triton is imported: the check runs in a
subprocess (``python tests/te/test_fused_kernels.py``)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _check() -> None:
    from mmte.encoders import Backbone
    from mmte.te import kernels
    from tests.reference.compare import assert_same_forward_backward

    torch.manual_seed(0)
    for overrides in ({}, {"normalization": "RMSNorm", "activation": "quick_gelu"}):
        eager = Backbone("tiny", num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=48, **overrides)
        with torch.no_grad():
            for p in eager.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        fused = Backbone("tiny", num_layers=2, hidden_size=32, num_attention_heads=2, ffn_hidden_size=48, fused=True,
                         fusion="kernels", **overrides)
        fused.load_state_dict(eager.state_dict())
        assert all(isinstance(layer, kernels.KernelTransformerLayer) for layer in fused.layers.values())
        x = torch.randn(2, 5, 32)
        assert kernels.dispatches_to_triton(x), kernels.available("cpu")
        mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
        assert_same_forward_backward(eager, fused, x, mask, lambda o: o.pow(2).sum(), fwd_tol=(1.3e-6, 1e-5), bwd_tol=(1e-5, 1e-5))
    print("fused-kernels backbone OK")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_backbone_with_triton_kernels_matches_eager():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("MMTE_DISABLE_TRITON", None)
    proc = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "fused-kernels backbone OK" in proc.stdout, (proc.stdout + proc.stderr)[-6000:]


def test_kernels_fall_back_to_torch_on_plain_cpu(monkeypatch):
    """Without the interpreter, fusion="kernels" runs the torch composition: same numbers as eager."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from mmte.encoders import Backbone

    eager = Backbone("tiny").eval()
    fused = Backbone("tiny", fused=True, fusion="kernels").eval()
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), eager(x), rtol=1.3e-6, atol=1e-5)
    with pytest.raises(ValueError, match="fusion must be one of"):
        Backbone("tiny", fusion="magic")


if __name__ == "__main__":
    _check()
