"""Whole-sequence Mamba-2 emulator kernels (one launch per layer; see ``core/emulation.py`` for the
design). Reference: ``ssm.mamba2.emulate``; test: ``tests/test_emulate_kernels.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...precision import PrecisionConfig, parse_config
from ..core.emulation import (
    MAX_KERNEL_L,
    decay_sums,
    emulation_words,
    fake_quant,
    fake_quant3,
    format_code,
    lower_entry,
    lower_row,
    pow2_dim,
    prepare_emulation,
    window_sizes,
)
from ..core.rounding import FMT_CODES
from ..core.target import on_tensor_device


# ----------------------------------------------------------------------------------------------
# Mamba-2. Base pointers as for GDN; ``SX``/``SG`` are the token strides of x, y and of B, C.
# ----------------------------------------------------------------------------------------------
@triton.jit
def _m2_token(xb, dtb, Bb, Cb, t, T, pp, mp, nn, SX: tl.constexpr, SG: tl.constexpr,
              H: tl.constexpr):
    """One token's inputs (zeros past the end of the sequence)."""
    tt = t.to(tl.int64)
    ok = t < T
    mn = (nn * 0 + t) < T
    x = tl.load(xb + tt * SX + pp, mask=mp & ((pp * 0 + t) < T), other=0.0).to(tl.float32)
    dt = tl.load(dtb + tt * H, mask=ok, other=0.0)
    Bv = tl.load(Bb + tt * SG + nn, mask=mn, other=0.0).to(tl.float32)
    Cv = tl.load(Cb + tt * SG + nn, mask=mn, other=0.0).to(tl.float32)
    return x, dt, Bv, Cv


@triton.jit
def _m2_conv_step(S, x, dt, Bv, Cv, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                  SX: tl.constexpr, N: tl.constexpr, BP: tl.constexpr, CK: tl.constexpr,
                  SR: tl.constexpr, HAS_D: tl.constexpr):
    """Conventional step: output from the fp32 state, then the state rounded to the ckpt."""
    a = tl.exp(dt * A)
    S = a * S + (dt * x)[:, None] * Bv[None, :]
    y = tl.sum(S * Cv[None, :], axis=1)
    if HAS_D:
        y = y + Dh * x
    tl.store(yb + t.to(tl.int64) * SX + pp, y, mask=mp)
    return fake_quant(S, emulation_words(seed, layer, seq, t + 1, elem, SR, CK), CK, SR, BP, N)


@triton.jit(do_not_specialize=["T", "seed", "layer"])
def _m2_conv_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, s0_ptr, seq_ptr, y_ptr, sf_ptr, T, seed, layer,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, BP: tl.constexpr,
    CK: tl.constexpr, SR: tl.constexpr, HAS_D: tl.constexpr,
):
    SX: tl.constexpr = H * P
    SG: tl.constexpr = G * N
    b = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    g = h // (H // G)
    pp = pt * BP + tl.arange(0, BP)
    mp = pp < P
    nn = tl.arange(0, N)
    elem = (h * P + pp)[:, None] * N + nn[None, :]
    seq = tl.load(seq_ptr + b)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h)  # D_ptr is A when there is no D (then unused)
    base = b.to(tl.int64) * T
    xb = x_ptr + base * SX + h * P
    dtb = dt_ptr + base * H + h
    Bb = B_ptr + base * SG + g * N
    Cb = C_ptr + base * SG + g * N
    yb = y_ptr + base * SX + h * P
    sb = b.to(tl.int64) * (H * P * N)
    S = tl.load(s0_ptr + sb + elem, mask=mp[:, None], other=0.0)
    S = fake_quant(S, emulation_words(seed, layer, seq, seq * 0, elem, SR, CK), CK, SR, BP, N)
    z = T * 0
    x0, d0, B0, C0 = _m2_token(xb, dtb, Bb, Cb, z, T, pp, mp, nn, SX, SG, H)
    x1, d1, B1, C1 = _m2_token(xb, dtb, Bb, Cb, z + 1, T, pp, mp, nn, SX, SG, H)
    x2, d2, B2, C2 = _m2_token(xb, dtb, Bb, Cb, z + 2, T, pp, mp, nn, SX, SG, H)
    x3, d3, B3, C3 = _m2_token(xb, dtb, Bb, Cb, z + 3, T, pp, mp, nn, SX, SG, H)
    for c in range(T // 4):
        t = z + c * 4  # a tensor index also when interpreted
        # the next four tokens' loads are in flight while these four are computed
        nx0, nd0, nB0, nC0 = _m2_token(xb, dtb, Bb, Cb, t + 4, T, pp, mp, nn, SX, SG, H)
        nx1, nd1, nB1, nC1 = _m2_token(xb, dtb, Bb, Cb, t + 5, T, pp, mp, nn, SX, SG, H)
        nx2, nd2, nB2, nC2 = _m2_token(xb, dtb, Bb, Cb, t + 6, T, pp, mp, nn, SX, SG, H)
        nx3, nd3, nB3, nC3 = _m2_token(xb, dtb, Bb, Cb, t + 7, T, pp, mp, nn, SX, SG, H)
        S = _m2_conv_step(S, x0, d0, B0, C0, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x1, d1, B1, C1, A, Dh, yb, t + 1, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x2, d2, B2, C2, A, Dh, yb, t + 2, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        S = _m2_conv_step(S, x3, d3, B3, C3, A, Dh, yb, t + 3, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
        x0, d0, B0, C0 = nx0, nd0, nB0, nC0
        x1, d1, B1, C1 = nx1, nd1, nB1, nC1
        x2, d2, B2, C2 = nx2, nd2, nB2, nC2
        x3, d3, B3, C3 = nx3, nd3, nB3, nC3
    t = (T // 4) * 4
    if t < T:
        S = _m2_conv_step(S, x0, d0, B0, C0, A, Dh, yb, t, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    if t + 1 < T:
        S = _m2_conv_step(S, x1, d1, B1, C1, A, Dh, yb, t + 1, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    if t + 2 < T:
        S = _m2_conv_step(S, x2, d2, B2, C2, A, Dh, yb, t + 2, pp, mp, elem, seed, layer, seq,
                          SX, N, BP, CK, SR, HAS_D)
    tl.store(sf_ptr + sb + elem, S, mask=mp[:, None])


@triton.jit
def _m2_window_inputs(xb, dtb, Bb, Cb, t0, cnt, pp, mp, SX: tl.constexpr, SG: tl.constexpr,
                      H: tl.constexpr, N: tl.constexpr, L: tl.constexpr, LB: tl.constexpr):
    """The ``cnt`` tokens of the window starting at ``t0`` (zeros after them), in the forms the
    products need: ``x (BP, LB)``, dt and dt shifted by one ``(LB,)``, ``BA (KC, LB, 16)``,
    ``CB (KC, 16, LB)``, and the flush token's x ``(BP,)`` and C ``(KC, 1, 16)``."""
    KC: tl.constexpr = N // 16
    j = tl.arange(0, LB)
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    mj = j < cnt
    tok = t0.to(tl.int64) + j
    col_a = (c[:, None, None] * 16 + d[None, None, :]).to(tl.int64)
    col_b = (c[:, None, None] * 16 + d[None, :, None]).to(tl.int64)
    xw = tl.load(xb + tok[None, :] * SX + pp[:, None], mask=mj[None, :] & mp[:, None], other=0.0)
    dtw = tl.load(dtb + tok * H, mask=mj, other=0.0)
    dts = tl.load(dtb + (tok + 1) * H, mask=(j + 1) < cnt, other=0.0)
    BA = tl.load(Bb + tok[None, :, None] * SG + col_a, mask=mj[None, :, None], other=0.0)
    CB = tl.load(Cb + tok[None, None, :] * SG + col_b, mask=mj[None, None, :], other=0.0)
    tf = t0.to(tl.int64) + L - 1
    xf = tl.load(xb + tf * SX + pp, mask=mp & ((pp * 0 + cnt) == L), other=0.0)
    Cf = tl.load(Cb + tf * SG + col_a, mask=(col_a * 0 + cnt) == L, other=0.0)
    return (xw.to(tl.float32), dtw, dts, BA.to(tl.float32), CB.to(tl.float32),
            xf.to(tl.float32), Cf.to(tl.float32))


@triton.jit
def _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, t0, cnt, nout, pp, mp,
               SX: tl.constexpr, BP: tl.constexpr, KC: tl.constexpr, LB: tl.constexpr,
               FLUSH: tl.constexpr, HAS_D: tl.constexpr):
    """Outputs of the window's first ``nout`` tokens from the read source ``R``, and the fp32
    state folded over its ``cnt`` records (the flush output from it when FLUSH). States are
    ``(KC, BP, 16)`` chunks; products over d_state are batched over the chunks, then summed."""
    j = tl.arange(0, LB)
    excl, tot = decay_sums(dtw, dts, LB)
    BC = tl.sum(tl.dot(BA, CB, input_precision="ieee"), axis=0)  # [i, j] = B_i . C_j
    W = tl.where(j[None, :] <= j[:, None], tl.exp(A * excl) * dtw[None, :] * tl.trans(BC), 0.0)
    SC = tl.sum(tl.dot(R, CB, input_precision="ieee"), axis=0)  # (BP, LB): R C_j
    Y = tl.exp(A * tot)[None, :] * SC + tl.dot(xw, tl.trans(W), input_precision="ieee")
    if HAS_D:
        Y = Y + Dh * xw
    tok = t0.to(tl.int64) + j
    tl.store(yb + tok[None, :] * SX + pp[:, None], Y, mask=(j < nout)[None, :] & mp[:, None])
    wf = tl.where(j < cnt, tl.exp(A * lower_row(excl, cnt - 1, LB)) * dtw, 0.0)
    ef = tl.exp(A * lower_entry(tot, cnt - 1, LB))
    Xw = tl.broadcast_to((xw * wf[None, :])[None, :, :], (KC, BP, LB))
    S = ef * S + tl.dot(Xw, BA, input_precision="ieee")
    if FLUSH:
        y = tl.sum(tl.sum(S * Cf, axis=2), axis=0)
        if HAS_D:
            y = y + Dh * xf
        tl.store(yb + (t0.to(tl.int64) + cnt - 1) * SX + pp, y, mask=mp)
    return S


@triton.jit(do_not_specialize=["T", "seed", "layer"])
def _m2_window_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, s0_ptr, seq_ptr, y_ptr, sf_ptr, T, seed, layer,
    H: tl.constexpr, P: tl.constexpr, N: tl.constexpr, G: tl.constexpr, L: tl.constexpr,
    LB: tl.constexpr, BP: tl.constexpr, CK: tl.constexpr, RD: tl.constexpr, SR: tl.constexpr,
    HAS_D: tl.constexpr, PREFETCH: tl.constexpr,
):
    SX: tl.constexpr = H * P
    SG: tl.constexpr = G * N
    KC: tl.constexpr = N // 16
    b = tl.program_id(0)
    h = tl.program_id(1)
    pt = tl.program_id(2)
    g = h // (H // G)
    pp = pt * BP + tl.arange(0, BP)
    mp = pp < P
    c = tl.arange(0, KC)
    d = tl.arange(0, 16)
    # element (p, 16 c + d) of the head's state, held as chunk c, row p, column d
    elem = (h * P + pp)[None, :, None] * N + c[:, None, None] * 16 + d[None, None, :]
    mrow = mp[None, :, None]
    seq = tl.load(seq_ptr + b)
    A = tl.load(A_ptr + h)
    Dh = tl.load(D_ptr + h)  # D_ptr is A when there is no D (then unused)
    base = b.to(tl.int64) * T
    xb = x_ptr + base * SX + h * P
    dtb = dt_ptr + base * H + h
    Bb = B_ptr + base * SG + g * N
    Cb = C_ptr + base * SG + g * N
    yb = y_ptr + base * SX + h * P
    sb = b.to(tl.int64) * (H * P * N)
    S = tl.load(s0_ptr + sb + elem, mask=mrow, other=0.0)
    r = emulation_words(seed, layer, seq, seq * 0, elem, SR, CK)
    S = fake_quant3(S, r, CK, SR)
    R = S
    if RD >= 0:
        R = fake_quant3(S, r, RD, False)
    z = T * 0
    if PREFETCH:
        xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(xb, dtb, Bb, Cb, z, tl.minimum(T, L),
                                                         pp, mp, SX, SG, H, N, L, LB)
    nfull = T // L
    for w in range(nfull):
        t0 = z + w * L  # a tensor index also when interpreted
        if PREFETCH:  # the next window's loads are in flight while this one is computed
            nxw, ndtw, ndts, nBA, nCB, nxf, nCf = _m2_window_inputs(
                xb, dtb, Bb, Cb, t0 + L, tl.minimum(T - t0 - L, L), pp, mp, SX, SG, H, N, L, LB)
        else:
            xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(
                xb, dtb, Bb, Cb, t0, z + L, pp, mp, SX, SG, H, N, L, LB)
        S = _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, t0, L, L - 1, pp, mp, SX,
                       BP, KC, LB, True, HAS_D)
        r = emulation_words(seed, layer, seq, z + w + 1, elem, SR, CK)
        S = fake_quant3(S, r, CK, SR)
        R = S
        if RD >= 0:
            R = fake_quant3(S, r, RD, False)
        if PREFETCH:
            xw, dtw, dts, BA, CB, xf, Cf = nxw, ndtw, ndts, nBA, nCB, nxf, nCf
    rem = T - nfull * L
    if rem > 0:  # records left pending: outputs, and S_final = what the next flush would fold
        if not PREFETCH:
            xw, dtw, dts, BA, CB, xf, Cf = _m2_window_inputs(
                xb, dtb, Bb, Cb, nfull * L, rem, pp, mp, SX, SG, H, N, L, LB)
        S = _m2_window(S, R, xw, dtw, dts, BA, CB, xf, Cf, A, Dh, yb, nfull * L, rem, rem, pp,
                       mp, SX, BP, KC, LB, False, HAS_D)
    tl.store(sf_ptr + sb + elem, S, mask=mrow)


def mamba2_supported(cfg: PrecisionConfig | str, d_state: int) -> bool:
    """Shapes and configs the Mamba-2 emulator kernels handle (others run the reference)."""
    return pow2_dim(d_state) and parse_config(cfg).L <= MAX_KERNEL_L


@on_tensor_device
def mamba2_emulate(
    cfg: PrecisionConfig | str, S0: torch.Tensor | None, x: torch.Tensor, dt: torch.Tensor,
    A: torch.Tensor, Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, *,
    layer: int = 0, seed: int = 0, sequence: torch.Tensor | None = None,
    act_dtype: torch.dtype = torch.float32, block_p: int | None = None,
    num_warps: int | None = None, prefetch: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssm.mamba2.emulate`` in one launch: ``x (B, T, H, P)``, ``dt (B, T, H)`` fp32,
    ``A (H,)``, ``Bm, C (B, T, G, N)``, ``D (H,)`` or None -> ``(y (B, T, H, P),
    S_final (B, H, P, N))`` fp32.

    ``x`` and ``Bm`` are rounded through ``act_dtype`` before the launch, like the reference.
    Launch knobs (results do not depend on them; defaults are the fastest measured on the
    H200): ``block_p`` head-dim rows per program (default 4
    conventional, 2 for an fp16-SR state, 8 for a bf16-SR state, 64 windowed: the chunk
    products need >= 16, and fewer, larger tiles mean fewer waves), ``num_warps`` (default
    1 / 8), ``prefetch`` (windowed: hold the next window's inputs in registers while computing
    this window; default on)."""
    from ...ssm.replay import check_row_length, check_tensor

    floats = (torch.float32, torch.float16, torch.bfloat16)
    check_tensor("x", x, (None, None, None, None), floats, x.device)
    n, T, H, P = x.shape
    check_tensor("Bm", Bm, (n, T, None, None), floats, x.device)
    G, N = Bm.shape[2], Bm.shape[3]
    check_tensor("C", C, (n, T, G, N), floats, x.device)
    check_tensor("dt", dt, (n, T, H), (torch.float32,), x.device)
    check_tensor("A", A, (H,), (torch.float32,), x.device)
    if D is not None:
        check_tensor("D", D, (H,), (torch.float32,), x.device)
    if H % G:
        raise ValueError(f"num_heads ({H}) must be a multiple of n_groups ({G})")
    cfg, S0, seq = prepare_emulation(cfg, n, S0, (n, H, P, N), sequence, layer, seed, act_dtype,
                            x.device)
    check_row_length(cfg, N, "d_state")
    if not mamba2_supported(cfg, N):
        raise ValueError(f"the Mamba-2 emulator kernels need d_state a power of two >= 16 "
                         f"and L <= {MAX_KERNEL_L}; got d_state={N}, L={cfg.L}")
    x = x.to(act_dtype).contiguous()
    Bm = Bm.to(act_dtype).contiguous()
    C, dt, A = C.contiguous(), dt.contiguous(), A.contiguous()
    y = torch.empty(n, T, H, P, dtype=torch.float32, device=x.device)
    sf = torch.empty(n, H, P, N, dtype=torch.float32, device=x.device)
    Dt = D.contiguous() if D is not None else A
    args = (x, dt, A, Bm, C, Dt, S0, seq, y, sf, T, int(seed), int(layer))
    ck, sr = format_code(cfg.ckpt), cfg.uses_sr
    if cfg.L == 1:
        BP = min(block_p or (2 if sr and ck == FMT_CODES["fp16"] else
                             8 if sr and ck == FMT_CODES["bf16"] else 4),
                 triton.next_power_of_2(P))
        _m2_conv_kernel[(n, H, triton.cdiv(P, BP))](
            *args, H=H, P=P, N=N, G=G, BP=BP, CK=ck, SR=sr, HAS_D=D is not None,
            num_warps=num_warps or 1)
    else:
        BP = max(16, min(block_p or 64, triton.next_power_of_2(P)))
        LB, _ = window_sizes(cfg.L)
        _m2_window_kernel[(n, H, triton.cdiv(P, BP))](
            *args, H=H, P=P, N=N, G=G, L=cfg.L, LB=LB, BP=BP, CK=ck, RD=format_code(cfg.read), SR=sr,
            HAS_D=D is not None, PREFETCH=True if prefetch is None else bool(prefetch),
            num_warps=num_warps or 8)
    return y, sf
