"""Reference number formats: exactness, saturation, NaN, SR statistics, packing, Philox."""

import pytest
import torch

from replayssm_quant import formats as F

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16,
                "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


def _wide_values(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 4)


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_rn_matches_torch_casts(name):
    fmt = F.canonical_format(name)
    x = _wide_values(1 << 18, 1).clamp(-fmt.max_finite, fmt.max_finite)
    ours = F.round_elements(x, fmt, "rn")
    theirs = x.to(TORCH_DTYPES[name]).float()
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", list(TORCH_DTYPES) + ["nvfp4"])
def test_saturation_and_nan(name):
    fmt = F.canonical_format(name)
    x = torch.tensor([3.4e38, -3.4e38, float("inf"), -float("inf"), float("nan"), 0.0, -0.0])
    for rounding in ("rn", "sr"):
        r = torch.randint(0, 2**32, x.shape, dtype=torch.int64)
        y = F.round_elements(x, fmt, rounding, r)
        assert y[:4].tolist() == [fmt.max_finite, -fmt.max_finite, fmt.max_finite, -fmt.max_finite]
        assert torch.isnan(y[4])
        assert y[5] == 0 and not torch.signbit(y[5]) and torch.signbit(y[6])


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8e4m3", "fp8e5m2", "nvfp4"])
def test_sr_unbiased(name):
    """Mean SR error is within 4 standard errors of zero over 1e6 samples."""
    fmt = F.canonical_format(name)
    n = 1_000_000
    x = _wide_values(n, 2)
    x = x / x.abs().max() * min(fmt.max_finite, 1e4) * 0.5
    r = F.sr_bits(7, 0, 0, 0, torch.arange(n))
    err = (F.round_elements(x, fmt, "sr", r).double() - x.double())
    # normalise by the grid step so every sample counts on the same scale
    scale = F.round_elements(x.abs() * 2, fmt, "rn").double() - F.round_elements(x.abs(), fmt, "rn").double()
    z = err / scale.clamp_min(1e-30)
    z = z[torch.isfinite(z)]
    assert abs(z.mean().item()) < 4 * z.std().item() / z.numel() ** 0.5
    # and RN is visibly biased on the same data? not necessarily; check SR differs from RN
    assert not torch.equal(F.round_elements(x, fmt, "sr", r), F.round_elements(x, fmt, "rn"))


def test_sr_unbiased_at_fixed_point():
    """A value 1/4 of the way between two fp16 neighbours rounds up a quarter of the time."""
    lo = torch.tensor(1.0)
    step = 2.0**-10
    x = torch.full((400_000,), 1.0 + step / 4)
    r = F.sr_bits(3, 1, 2, 5, torch.arange(x.numel()))
    y = F.round_elements(x, "fp16", "sr", r)
    frac_up = (y > lo).double().mean().item()
    assert abs(frac_up - 0.25) < 4 * (0.25 * 0.75 / x.numel()) ** 0.5
    assert set(y.unique().tolist()) == {1.0, 1.0 + step}


def test_sr_deterministic_and_seeded():
    x = torch.randn(4096)
    e = torch.arange(4096)
    a = F.round_elements(x, "fp16", "sr", F.sr_bits(1, 0, 0, 0, e))
    b = F.round_elements(x, "fp16", "sr", F.sr_bits(1, 0, 0, 0, e))
    c = F.round_elements(x, "fp16", "sr", F.sr_bits(2, 0, 0, 0, e))
    d = F.round_elements(x, "fp16", "sr", F.sr_bits(1, 0, 0, 1, e))
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, d)


def test_philox_known_answer():
    """Philox-4x32-10 of the Random123 known-answer vector (counter 0, key 0)."""
    w = F.philox4x32(0, 0, 0, 0, 0)
    assert [int(t) for t in w] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    w = F.philox4x32(0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF,
                     0xFFFFFFFF | (0xFFFFFFFF << 32) & (2**63 - 1))
    assert all(0 <= int(t) < 2**32 for t in w)


def test_nvfp4_roundtrips_representable_values():
    """Rows built from grid values times power-of-two scales survive exactly."""
    g = torch.Generator().manual_seed(3)
    vals = torch.tensor(F.E2M1_VALUES)
    codes = torch.randint(0, 8, (64, 128), generator=g)
    sign = torch.randint(0, 2, (64, 128), generator=g) * 2 - 1
    x = vals[codes] * sign
    x[:, ::16] = 6.0  # every block reaches amax 6 so the block scale is exactly 1 * row scale
    x = x * 2.0 ** torch.randint(-4, 5, (64, 1), generator=g)
    q = F.quantize(x, "nvfp4")
    y = F.dequantize(q)
    rel = (y - x).abs().max() / x.abs().max()
    assert rel < 1e-6


def test_nvfp4_within_half_step():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(256, 128, generator=g) * torch.exp(torch.randn(256, 1, generator=g))
    row_scale, s, eff = F.nvfp4_scales(x)
    y = F.dequantize(F.quantize(x, "nvfp4"))
    t = x.view(256, 8, 16) / eff.unsqueeze(-1)
    # grid step at |t|: 0.5 below 2, 1 in [2,4), 2 above
    step = torch.where(t.abs() < 2, 0.5, torch.where(t.abs() < 4, 1.0, 2.0))
    err = ((y.view(256, 8, 16) - x.view(256, 8, 16)) / eff.unsqueeze(-1)).abs()
    assert (err <= step / 2 + 1e-5).all()


def test_nvfp4_packing_matches_torch_fp4_view():
    x = torch.randn(8, 64)
    q = F.quantize(x, "nvfp4")
    v = q.data.view(torch.float4_e2m1fn_x2)
    assert v.shape == (8, 32)
    codes = F.unpack_nibbles(q.data)
    # element 2i is the low nibble: check against the nibble order of the packed byte
    assert torch.equal(codes[:, 0::2], q.data & 0xF)
    assert torch.equal(codes[:, 1::2], q.data >> 4)
    # the block scales are E4M3 values and the packed view round-trips through torch
    assert q.block_scale.dtype == torch.float8_e4m3fn
    assert torch.equal(v.view(torch.uint8), q.data)


def test_nvfp4_nan_marks_its_block_and_is_counted():
    x = torch.randn(2, 64)
    x[0, 20] = float("nan")
    q = F.quantize(x, "nvfp4")
    y = F.dequantize(q)
    assert int(q.nan_count) == 1
    assert torch.isnan(y[0, 16:32]).all()
    assert torch.isfinite(y[0, :16]).all() and torch.isfinite(y[1]).all()


def test_fp8_row_scaled():
    x = torch.randn(16, 128) * torch.exp(torch.randn(16, 1) * 3)
    q = F.quantize(x, "fp8")
    assert torch.allclose(q.row_scale, x.abs().amax(-1) / 448)
    y = F.dequantize(q)
    assert ((y - x).abs() <= x.abs().amax(-1, keepdim=True) / 448 * 16).all()
    xn = x.clone()
    xn[3, 5] = float("nan")
    qn = F.quantize(xn, "fp8")
    assert int(qn.nan_count) == 1 and torch.isnan(F.dequantize(qn)[3, 5])


def test_zero_rows():
    for name in ("fp8", "nvfp4", "fp16"):
        y = F.fake_quantize(torch.zeros(3, 32), name)
        assert torch.equal(y, torch.zeros(3, 32))


def test_errors():
    with pytest.raises(ValueError, match="unknown number format 'fp7'"):
        F.canonical_format("fp7")
    with pytest.raises(ValueError, match="unknown rounding"):
        F.round_elements(torch.ones(2), "fp16", "up")
    with pytest.raises(ValueError, match="needs random words"):
        F.round_elements(torch.ones(2), "fp16", "sr")
    with pytest.raises(ValueError, match="divisible by 32"):
        F.quantize(torch.ones(2, 48), "nvfp4")
    with pytest.raises(ValueError, match="shape"):
        F.quantize(torch.ones(2, 32), "fp16", "sr", torch.zeros(2, 16, dtype=torch.int64))
