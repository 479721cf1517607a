"""Quantize/dequantize per recipe layout: scale choice against loop references, round-trip error bounds."""

import math

import pytest
import torch

from mmte.fp8 import (
    E4M3,
    E5M2,
    E8M0_DTYPE,
    mx_scale_exponent,
    quantize_blockwise,
    quantize_mx,
    quantize_tensorwise,
    scale_from_amax,
)

from . import reference as ref


def _spread(shape, seed=0):
    """Values over several decades, with per-row/column magnitude differences (what blocks are for)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    rows = torch.logspace(-3, 2, shape[0])[:, None]
    cols = torch.logspace(-1, 1, shape[1])[None, :]
    return x * rows * cols


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["E4M3", "E5M2"])
def test_tensorwise_round_trip_matches_reference(fmt):
    x = torch.randn(64, 48) * 3
    s = scale_from_amax(x.abs().amax(), fmt.max)
    assert s.item() == pytest.approx(fmt.max / x.abs().max().item(), rel=1e-6)
    q = quantize_tensorwise(x, fmt, s)
    assert q.data.dtype == fmt.dtype and q.scale_inv.shape == ()
    want = torch.tensor([ref.round_saturate(v, fmt.name) for v in (x * s).flatten().tolist()]).view_as(x) / s
    torch.testing.assert_close(q.dequantize(), want, rtol=1e-6, atol=0)
    # relative error of normal values is at most half a mantissa step
    rel = ((q.dequantize() - x).abs() / x.abs()).max().item()
    assert rel <= 2.0 ** -(fmt.mantissa_bits + 1) + 1e-6


def test_scale_from_amax_edge_cases_and_margin():
    a = torch.tensor([0.0, math.inf, math.nan, 2.0, 1e-45])
    s = scale_from_amax(a, 448.0, margin=1)
    assert s[:3].tolist() == [1.0, 1.0, 1.0]
    assert s[3].item() == 448.0 / 2.0 / 2.0
    assert s[4].item() == 1.0  # 448 / 1e-45 overflows fp32: keep 1
    p2 = scale_from_amax(torch.tensor([3.0, 448.0, 0.7]), 448.0, power_2=True)
    assert p2.tolist() == [128.0, 1.0, 512.0]  # 149.3 -> 128, 1 -> 1, 640 -> 512


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 16)])
def test_block_scale_choice(block):
    x = _spread((256, 384))
    x[5, 7] = 0.0
    x[128:, 256:] = 0.0  # an all-zero weight block / tiles
    q = quantize_blockwise(x, E4M3, block)
    br, bc = block
    assert q.scale_inv.shape == (256 // br, 384 // bc)
    for i in range(0, 256, max(br, 37)):
        for j in range(384 // bc):
            bi = i // br
            blk = x[bi * br : (bi + 1) * br, j * bc : (j + 1) * bc]
            a = blk.abs().max().item()
            want_scale = 448.0 / a if a > 0 else 1.0
            assert q.scale_inv[bi, j].item() == pytest.approx(1 / want_scale, rel=1e-6)
    # every block's amax maps onto 448 exactly: the block max is representable
    deq = q.dequantize()
    assert deq.abs().max().item() == pytest.approx(x.abs().max().item(), rel=1e-6)
    rel = ((deq - x).abs() / x.abs().clamp_min(1e-30))[x != 0]
    small = x.abs() >= 2.0**-6 * 448  # values that stay normal after scaling in any block
    assert rel[small[x != 0]].max().item() <= 2.0**-4 + 1e-6


def test_block_beats_tensorwise_on_spread_data():
    x = _spread((128, 256))
    qt = quantize_tensorwise(x, E4M3, scale_from_amax(x.abs().amax(), 448.0)).dequantize()
    qb = quantize_blockwise(x, E4M3, (1, 128)).dequantize()
    err_t = ((qt - x).norm() / x.norm()).item()
    err_b = ((qb - x).norm() / x.norm()).item()
    # rows of small values underflow to 0 under one scale; 1x128 tiles keep them
    assert (qt == 0).sum() > 100 and (qb == 0).sum() == 0
    assert err_b < err_t


def test_ragged_blocks_equal_padded():
    x = _spread((70, 100))
    q = quantize_blockwise(x, E4M3, (1, 128))
    xp = torch.nn.functional.pad(x, (0, 28))
    qp = quantize_blockwise(xp, E4M3, (1, 128))
    assert torch.equal(q.data.view(torch.uint8), qp.data[:, :100].view(torch.uint8))
    assert torch.equal(q.scale_inv, qp.scale_inv)


@pytest.mark.parametrize("rounding", ["ceil", "floor"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["E4M3", "E5M2"])
def test_mx_scale_choice(rounding, fmt):
    x = _spread((8, 256), seed=1)
    # boundaries: block amax exactly fp8_max * 2^k, just above it, a zero block, a tiny block
    x[0, :32] = 0.0
    x[0, 3] = fmt.max * 4
    x[1, :32] = x[1, :32].clamp(-1, 1)
    x[1, 0] = fmt.max * 4 * (1 + 2**-20)
    x[2, :32] = 0.0
    x[3, :32] = 1e-30
    q = quantize_mx(x, fmt, 32, rounding)
    assert q.scale_inv.dtype == E8M0_DTYPE and q.scale_inv.shape == (8, 8)
    for r in range(8):
        for b in range(8):
            a = x[r, b * 32 : (b + 1) * 32].abs().max().item()
            e = ref.mx_exponent(a, fmt.max, fmt.max_exponent, rounding)
            assert q.scale_inv[r, b].float().item() == math.ldexp(1.0, e), (r, b, a)
    # amax = 4 * max exactly: 2^2 under both roundings; just above it: ceil moves to 2^3, floor stays
    assert q.scale_inv[0, 0].float().item() == 4.0
    assert q.scale_inv[1, 0].float().item() == (8.0 if rounding == "ceil" else 4.0)
    assert q.scale_inv[2, 0].float().item() == 2.0**-127
    deq = q.dequantize()
    sat = deq.abs() >= fmt.max * q.scale_inv_full() * (1 - 1e-7)
    if rounding == "ceil":  # nothing saturates: every value is within half a step
        nz = x.abs() > 0
        rel = ((deq - x).abs() / x.abs().clamp_min(1e-38))[nz & (x.abs() >= q.scale_inv_full() * 2.0 ** (1 - fmt.bias))]
        assert rel.max().item() <= 2.0 ** -(fmt.mantissa_bits + 1) + 1e-6
    else:
        assert sat.any() or fmt is E5M2


def test_mx_exponent_nan_inf_and_clamp():
    a = torch.tensor([math.nan, math.inf, 0.0, 1e38, 1e-40])
    e = mx_scale_exponent(a, E4M3, "ceil")
    assert e.tolist()[2:] == [-127, ref.mx_exponent(1e38, 448.0, 8, "ceil"), -127]
    x = torch.ones(2, 32)
    x[1, 5] = math.nan
    q = quantize_mx(x, E4M3)
    assert q.scale_inv[0, 0].float().item() == 2.0**-8  # 1 <= 448 * 2^-8 = 1.75
    assert q.scale_inv[1].float().isnan().all() and q.dequantize()[1].isnan().all()


def test_square_block_transpose_and_errors():
    x = _spread((256, 128))
    q = quantize_blockwise(x, E4M3, (128, 128))
    qt = q.t()
    assert torch.equal(qt.dequantize(), q.dequantize().t())
    with pytest.raises(ValueError, match="1x128-block"):
        quantize_blockwise(x, E4M3, (1, 128)).t()
    with pytest.raises(ValueError, match=r"2-d tensor \[R, C\]; got shape \(2, 3, 4\)"):
        quantize_blockwise(torch.ones(2, 3, 4), E4M3, (1, 128))
