"""FP8 element formats against references written from the format definitions (tests/fp8/reference.py)."""

import itertools
import math

import pytest
import torch

from mmte.fp8 import E4M3, E5M2, E8M0_DTYPE, Format, cast_to_fp8, get_format

from . import reference as ref

FORMATS = {"E4M3": E4M3, "E5M2": E5M2}


@pytest.mark.parametrize("name", ["E4M3", "E5M2"])
def test_every_code_decodes_as_the_definition(name):
    fmt = FORMATS[name]
    codes = torch.arange(256, dtype=torch.uint8)
    got = codes.view(fmt.dtype).float().tolist()
    for c, g in enumerate(got):
        want = ref.decode(c, name)
        if math.isnan(want):
            assert math.isnan(g), (name, hex(c), g)
        else:
            assert g == want, (name, hex(c), g, want)
    nans = sum(math.isnan(ref.decode(c, name)) for c in range(256))
    assert nans == (2 if name == "E4M3" else 6)


@pytest.mark.parametrize("name", ["E4M3", "E5M2"])
def test_every_finite_code_round_trips(name):
    fmt = FORMATS[name]
    values = [ref.decode(c, name) for c in range(256)]
    finite = [(c, v) for c, v in enumerate(values) if math.isfinite(v)]
    x = torch.tensor([v for _, v in finite], dtype=torch.float32)
    q = cast_to_fp8(x, fmt)
    assert q.dtype == fmt.dtype
    back = q.view(torch.uint8).tolist()
    for (c, v), b in zip(finite, back):
        if v == 0:  # +0 and -0 both decode to 0
            assert b in (0x00, 0x80)
        else:
            assert b == c, (name, hex(c), hex(b))


def test_format_constants_match_definitions():
    assert E4M3.max == ref.max_finite("E4M3") == 448.0
    assert E5M2.max == ref.max_finite("E5M2") == 57344.0
    assert E4M3.min_subnormal == ref.decode(0x01, "E4M3") == 2.0**-9
    assert E5M2.min_subnormal == ref.decode(0x01, "E5M2") == 2.0**-16
    assert (E4M3.max_exponent, E5M2.max_exponent) == (8, 15)


@pytest.mark.parametrize("name", ["E4M3", "E5M2"])
def test_rounding_is_nearest_even_with_saturation(name):
    fmt = FORMATS[name]
    table = ref.finite_codes(name)
    # exact midpoints between neighbours (ties), points just off them, and random values over the range
    mids = [(a + b) / 2 for (a, _), (b, _) in itertools.pairwise(table)]
    off = [m * (1 + 2**-12) for m in mids[1:]] + [m * (1 - 2**-12) for m in mids[1:]]
    g = torch.Generator().manual_seed(0)
    rand = (torch.rand(2000, generator=g) * 2 - 1) * fmt.max * 1.2
    small = (torch.rand(500, generator=g) * 2 - 1) * 8 * fmt.min_subnormal
    vals = torch.tensor(mids + off, dtype=torch.float32)
    x = torch.cat([vals, -vals, rand, small, torch.tensor([fmt.max * 3, -fmt.max * 1.01, 1e30, -1e30])])
    got = cast_to_fp8(x, fmt).float().tolist()
    for xi, gi in zip(x.tolist(), got):
        assert gi == ref.round_saturate(xi, name), (name, xi, gi, ref.round_saturate(xi, name))


def test_saturation_nan_and_inf():
    x = torch.tensor([448.0, 449.0, 464.0, 1e6, math.inf, -math.inf, math.nan])
    q = cast_to_fp8(x, E4M3).float()
    assert q[:6].tolist() == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]
    assert math.isnan(q[6])
    y = torch.tensor([57344.0, 61439.0, 61440.0, 1e9, math.inf, -math.inf, math.nan])
    q = cast_to_fp8(y, E5M2).float()
    assert q[:6].tolist() == [57344.0, 57344.0, 57344.0, 57344.0, 57344.0, -57344.0]
    assert math.isnan(q[6])
    # the raw (non-saturating) E5M2 cast would have produced inf from 61440 on: saturation is ours
    assert torch.tensor([61440.0]).to(torch.float8_e5m2).float().isinf().all()
    # inf and NaN codes of E5M2 decode as such
    codes = torch.tensor([0x7C, 0xFC, 0x7D, 0x7F], dtype=torch.uint8).view(torch.float8_e5m2).float()
    assert codes[0] == math.inf and codes[1] == -math.inf and codes[2:].isnan().all()


def test_scale_is_applied_before_the_cast():
    x = torch.tensor([1.0, 0.001, 3.0])
    q = cast_to_fp8(x, E4M3, torch.tensor(100.0)).float()
    assert q.tolist() == [ref.round_saturate(v * 100.0, "E4M3") for v in x.tolist()]


def test_e8m0_codes_are_powers_of_two():
    codes = torch.arange(255, dtype=torch.uint8)
    vals = codes.view(E8M0_DTYPE).float()
    want = torch.tensor([math.ldexp(1.0, c - 127) for c in range(255)], dtype=torch.float32)
    assert torch.equal(vals, want)
    assert torch.tensor([255], dtype=torch.uint8).view(E8M0_DTYPE).float().isnan().all()


def test_format_enum_and_errors():
    assert Format.HYBRID.fwd is E4M3 and Format.HYBRID.bwd is E5M2
    assert Format.E4M3.bwd is E4M3 and Format.E5M2.fwd is E5M2
    assert get_format("hybrid") is Format.HYBRID
    with pytest.raises(ValueError, match="E4M3.*got 'E3M4'"):
        get_format("E3M4")
    with pytest.raises(TypeError, match="E4M3 or E5M2"):
        cast_to_fp8(torch.ones(2), "E4M3")
