"""Mamba-2 ReplaySSM reference: the decode numerics every Mamba-2 kernel is checked against.

Per head ``h`` (group ``h // (H // G)``), state ``S`` of shape ``(P, N)``:
``a_t = exp(dt_t A)``, ``S_t = a_t S_{t-1} + dt_t x_t B_t^T``, ``y_t = S_t C_t + D x_t``.
With checkpoint ``S_c`` and ring records ``j = c+1..t``::

    y_t = G(c+1..t) (S_c C_t) + sum_j G(j+1..t) dt_j (B_j . C_t) x_j + D x_t
    G(a..b) = exp(A * sum_{i=a..b} dt_i)

All math is fp32 on the values the ring stores (``x`` and ``B`` are cast to the state's
``act_dtype`` on the way in, so every path sees the same values). Batch rows address cache
slots through ``slots``; negative slots are padding rows (zero output, no state change).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..precision import PrecisionConfig, parse_config
from .replay import (
    ReplayState,
    as_config,
    check_act_dtype,
    check_common,
    check_flush_position,
    check_row_length,
    check_slots,
    check_tensor,
    commit_records,
    common_fields,
    empty_checkpoints,
    enable_read_cache,
    expand_heads,
    fill_rows,
    load_state,
    positions,
    read_checkpoint,
    read_source,
    ring_put,
    ring_window,
    suffix_sums,
    write_checkpoint,
)

__all__ = [
    "Mamba2State",
    "commit",
    "conventional_step",
    "decode_step",
    "emulate",
    "flush",
    "init_mamba2_state",
    "nonflush_step",
    "sequential_reference",
    "state_value",
    "verify",
]

_F32 = (torch.float32,)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(kw_only=True)
class Mamba2State(ReplayState):
    """Mamba-2 replay state. Ring: ``x (slots, H, cap, P)`` and ``B (slots, G, cap, N)`` in
    ``act_dtype``, ``dt (slots, H, cap)`` fp32; checkpoint/read copy rows are ``N`` long."""

    x: torch.Tensor
    dt: torch.Tensor
    B: torch.Tensor

    @property
    def num_heads(self) -> int:
        return int(self.x.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.x.shape[3])

    @property
    def d_state(self) -> int:
        return int(self.B.shape[3])

    @property
    def n_groups(self) -> int:
        return int(self.B.shape[1])


def init_mamba2_state(
    cfg: PrecisionConfig | str,
    num_slots: int,
    num_heads: int,
    head_dim: int,
    d_state: int,
    n_groups: int = 1,
    *,
    layer: int = 0,
    seed: int = 0,
    spec_tokens: int = 0,
    act_dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    sr_sequence: torch.Tensor | None = None,
) -> Mamba2State:
    """A zero state for ``num_slots`` cache slots of one Mamba-2 layer."""
    cfg = as_config(cfg)
    device = torch.device(device) if device is not None else torch.device("cpu")
    check_common(layer, seed, spec_tokens, num_slots)
    check_act_dtype(act_dtype)
    for name, v in (("num_heads", num_heads), ("head_dim", head_dim), ("d_state", d_state),
                    ("n_groups", n_groups)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if num_heads % n_groups:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of n_groups ({n_groups})")
    check_row_length(cfg, d_state, "d_state")
    cap = cfg.L + spec_tokens
    ckpt, read = empty_checkpoints(cfg, (num_slots, num_heads, head_dim, d_state), device)
    return Mamba2State(
        ckpt=ckpt, read=read,
        x=torch.zeros(num_slots, num_heads, cap, head_dim, dtype=act_dtype, device=device),
        dt=torch.zeros(num_slots, num_heads, cap, dtype=torch.float32, device=device),
        B=torch.zeros(num_slots, n_groups, cap, d_state, dtype=act_dtype, device=device),
        **common_fields(cfg, num_slots, layer, seed, spec_tokens, act_dtype, device,
                        sr_sequence),
    )


# ---------------------------------------------------------------------------------- inputs
@dataclass
class _Inputs:
    """Inputs of the non-padding rows, fp32, ``x`` rounded through ``act_dtype``."""

    rows: torch.Tensor
    slots: torch.Tensor
    x: torch.Tensor  # (n, [T,] H, P)
    dt: torch.Tensor  # (n, [T,] H)
    Bm: torch.Tensor  # (n, [T,] G, N)
    C: torch.Tensor  # (n, [T,] G, N)
    A: torch.Tensor  # (H,)
    D: torch.Tensor | None  # (H,)


def _check_state(state: object) -> Mamba2State:
    if not isinstance(state, Mamba2State):
        raise ValueError(f"expected a Mamba2State, got {type(state).__name__}")
    return state


def _inputs(state: Mamba2State, x, dt, A, Bm, C, D, slots, steps: int | None) -> _Inputs:
    """Validate one step's (``steps=None``) or a ``(B, T, ...)`` block's inputs."""
    rows, valid = check_slots(state, slots)
    H, P, N, G = state.num_heads, state.head_dim, state.d_state, state.n_groups
    lead = (slots.numel(),) if steps is None else (slots.numel(), steps)
    dev = state.device
    check_tensor("x", x, (*lead, H, P), _FLOATS, dev)
    check_tensor("dt", dt, (*lead, H), _F32, dev)
    check_tensor("A", A, (H,), _F32, dev)
    check_tensor("Bm", Bm, (*lead, G, N), _FLOATS, dev)
    check_tensor("C", C, (*lead, G, N), _FLOATS, dev)
    if D is not None:
        check_tensor("D", D, (H,), _F32, dev)
    act = state.act_dtype
    return _Inputs(
        rows=rows, slots=valid,
        x=x[rows].to(act).to(torch.float32), dt=dt[rows],
        Bm=Bm[rows].to(act).to(torch.float32), C=C[rows].to(torch.float32), A=A, D=D,
    )


def _skip(inp: _Inputs, x: torch.Tensor) -> torch.Tensor | float:
    """``D x`` (x with heads on dim -2)."""
    if inp.D is None:
        return 0.0
    return inp.D.view(-1, 1) * x


def _subset(inp: _Inputs, idx: torch.Tensor) -> _Inputs:
    return _Inputs(inp.rows[idx], inp.slots[idx], inp.x[idx], inp.dt[idx], inp.Bm[idx],
                   inp.C[idx], inp.A, inp.D)


# ---------------------------------------------------------------------------------- core math
def _readout(A: torch.Tensor, S: torch.Tensor, Cq: torch.Tensor, dt_w: torch.Tensor,
             x_w: torch.Tensor, B_w: torch.Tensor, upto: torch.Tensor) -> torch.Tensor:
    """Outputs (without ``D x``) of queries ``Cq (n, G, T, N)`` whose tokens sit at ring
    positions ``upto (n, T)``: ``G(c+1..t) S C_t + sum_{j<=t} G(j+1..t) dt_j (B_j.C_t) x_j``.

    ``S (n, H, P, N)`` is the read source; windows ``dt_w (n, H, W)``, ``x_w (n, H, W, P)``,
    ``B_w (n, G, W, N)``. Returns ``(n, H, T, P)``. Records after a query's token (stale
    entries, later drafts) are masked with ``where`` per query, not multiplied by 0, so a NaN
    there never reaches the output.
    """
    n, H, W = dt_w.shape
    pos = positions(n, W, dt_w.device)
    mask = (pos[:, None, :] <= upto[:, :, None])[:, None]  # (n, 1, T, W)
    dtm = torch.where(mask, dt_w[:, :, None, :], 0.0)  # (n, H, T, W)
    excl, tot = suffix_sums(dtm)
    a = A.view(1, H, 1, 1)
    bc = expand_heads(Cq @ B_w.transpose(-1, -2), H)  # (n, H, T, W): B_j . C_t
    wgt = torch.where(mask, torch.exp(a * excl) * dtm * bc, 0.0)
    xq = torch.where(mask[..., None], x_w[:, :, None], 0.0)  # (n, H, T, W, P) per query
    rec = (wgt.unsqueeze(-2) @ xq).squeeze(-2)  # (n, H, T, P)
    sc = expand_heads(Cq, H) @ S.transpose(-1, -2)  # (n, H, T, P): S_c C_t
    return torch.exp(A.view(1, H, 1) * tot)[..., None] * sc + rec


def _fold(A: torch.Tensor, S_c: torch.Tensor, dt_w: torch.Tensor, x_w: torch.Tensor,
          B_w: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``S_c`` advanced over the first ``count (n,)`` records of the windows:
    ``G(all) S_c + sum_j G(j+1..end) dt_j x_j B_j^T`` (fp32, not rounded)."""
    n, H, W = dt_w.shape
    valid = positions(n, W, dt_w.device) < count[:, None]  # (n, W)
    m = valid[:, None, :]
    dtm = torch.where(m, dt_w, 0.0)
    excl, tot = suffix_sums(dtm)
    wgt = torch.where(m, torch.exp(A.view(1, H, 1) * excl) * dtm, 0.0)  # (n, H, W)
    xm = torch.where(m[..., None], x_w, 0.0)
    bh = torch.where(m[..., None], expand_heads(B_w, H), 0.0)  # (n, H, W, N)
    add = (wgt[..., None] * xm).transpose(-1, -2) @ bh  # (n, H, P, N)
    return torch.exp(A.view(1, H) * tot)[..., None, None] * S_c + add


def _windows(state: Mamba2State, slots: torch.Tensor, width: int):
    return (ring_window(state.dt, slots, width), ring_window(state.x, slots, width),
            ring_window(state.B, slots, width))


def _append(state: Mamba2State, inp: _Inputs, pos: torch.Tensor) -> None:
    """Write the records of ``inp`` at ring positions ``pos`` ((n,) or (n, T))."""
    if pos.dim() == 1:
        ring_put(state.x, inp.slots, pos, inp.x)
        ring_put(state.dt, inp.slots, pos, inp.dt)
        ring_put(state.B, inp.slots, pos, inp.Bm)
    else:
        ring_put(state.x, inp.slots, pos, inp.x.transpose(1, 2))
        ring_put(state.dt, inp.slots, pos, inp.dt.transpose(1, 2))
        ring_put(state.B, inp.slots, pos, inp.Bm.transpose(1, 2))


def _conventional_rows(state: Mamba2State, inp: _Inputs) -> torch.Tensor:
    H = state.num_heads
    S = read_checkpoint(state, inp.slots)
    a = torch.exp(inp.dt * inp.A)  # (n, H)
    dx = inp.dt[..., None] * inp.x  # (n, H, P)
    S_t = a[..., None, None] * S + dx[..., None] * expand_heads(inp.Bm, H)[:, :, None, :]
    y = (S_t @ expand_heads(inp.C, H)[..., None]).squeeze(-1) + _skip(inp, inp.x)
    if state.cfg.uses_sr:  # the SR key; a write rounded to nearest needs none
        state.flush_index[inp.slots] += 1
    write_checkpoint(state, inp.slots, S_t)
    return y


def _nonflush_rows(state: Mamba2State, inp: _Inputs) -> torch.Tensor:
    cur = state.cursor[inp.slots].to(torch.int64)
    _append(state, inp, cur)
    S = read_source(state, inp.slots)
    y = _readout(inp.A, S, inp.C[:, :, None, :], *_windows(state, inp.slots, state.cfg.L),
                 upto=cur[:, None])
    state.cursor[inp.slots] += 1
    state.drafted[inp.slots] = 0
    return y.squeeze(2) + _skip(inp, inp.x)


def _flush_rows(state: Mamba2State, inp: _Inputs) -> torch.Tensor:
    L, H = state.cfg.L, state.num_heads
    _append(state, inp, state.cursor[inp.slots].to(torch.int64))
    count = torch.full_like(inp.slots, L)
    S_new = _fold(inp.A, read_checkpoint(state, inp.slots), *_windows(state, inp.slots, L),
                  count=count)
    y = (S_new @ expand_heads(inp.C, H)[..., None]).squeeze(-1) + _skip(inp, inp.x)
    state.flush_index[inp.slots] += 1
    write_checkpoint(state, inp.slots, S_new)
    state.cursor[inp.slots] = 0
    state.drafted[inp.slots] = 0
    return y


def _out(state: Mamba2State, batch: int, *mid: int) -> torch.Tensor:
    return torch.zeros(batch, *mid, state.num_heads, state.head_dim, dtype=torch.float32,
                       device=state.device)


# ---------------------------------------------------------------------------------- steps
def conventional_step(state: Mamba2State, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                      Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
                      slots: torch.Tensor) -> torch.Tensor:
    """Read the checkpoint, advance one token, write it back (``L == 1`` configs only).

    The output uses the fp32 ``S_t`` before rounding. Returns ``y (B, H, P)``.
    """
    state = _check_state(state)
    if state.cfg.L != 1:
        raise ValueError(f"conventional_step needs a config with L=1, got L={state.cfg.L}")
    inp = _inputs(state, x, dt, A, Bm, C, D, slots, None)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _conventional_rows(state, inp))


def nonflush_step(state: Mamba2State, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                  Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
                  slots: torch.Tensor) -> torch.Tensor:
    """A step that appends its record and reads the read source; never writes the state.

    Every row must have ``cursor < L - 1``. Returns ``y (B, H, P)``.
    """
    state = _check_state(state)
    inp = _inputs(state, x, dt, A, Bm, C, D, slots, None)
    check_flush_position(state, inp.slots, at_flush=False)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _nonflush_rows(state, inp))


def flush(state: Mamba2State, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
          Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
          slots: torch.Tensor) -> torch.Tensor:
    """The step whose record lands at position ``L - 1``: fold all ``L`` records into the
    checkpoint's value (never the read copy), output from the fp32 result, write the
    checkpoint and read copy. Every row must have ``cursor == L - 1``."""
    state = _check_state(state)
    inp = _inputs(state, x, dt, A, Bm, C, D, slots, None)
    check_flush_position(state, inp.slots, at_flush=True)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _flush_rows(state, inp))


def decode_step(state: Mamba2State, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
                slots: torch.Tensor) -> torch.Tensor:
    """One decode token per row: a flush where ``cursor == L - 1``, else a non-flush step
    (rows may mix); ``conventional_step`` when ``L == 1``. Returns ``y (B, H, P)``."""
    state = _check_state(state)
    inp = _inputs(state, x, dt, A, Bm, C, D, slots, None)
    y = _out(state, slots.numel())
    if not inp.rows.numel():
        return y
    if state.cfg.L == 1:
        y[inp.rows] = _conventional_rows(state, inp)
        return y
    at_flush = state.cursor[inp.slots] == state.cfg.L - 1
    nf = torch.nonzero(~at_flush).flatten()
    fl = torch.nonzero(at_flush).flatten()
    for idx, rows_fn in ((nf, _nonflush_rows), (fl, _flush_rows)):
        if idx.numel():  # rows in step (the usual case) need no copy of their inputs
            sub = inp if idx.numel() == inp.rows.numel() else _subset(inp, idx)
            y[sub.rows] = rows_fn(state, sub)
    return y


def verify(state: Mamba2State, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
           Bm: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
           slots: torch.Tensor) -> torch.Tensor:
    """Append ``T`` draft records after the committed ones and compute their outputs at once
    in chunk form from the read source; the cursor does not move (see :func:`commit`).

    Inputs are stacked on dim 1 (``x (B, T, H, P)``, ...); returns ``y (B, T, H, P)``.
    ``O = G (S_c C) + (W * (C . B)) x`` with ``W`` the causal decay/dt weights over the
    committed and draft records. In exact arithmetic this equals sequential decoding. In
    floating point the outputs up to and including the last non-flush position of the
    window match it to fp32 rounding; a draft at a flush position (and any after it) reads
    the old read source plus the records instead of the flushed checkpoint / new read copy.
    """
    state = _check_state(state)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("verify: x must be (B, T, H, P)")
    T = int(x.shape[1])
    if T < 1:
        raise ValueError("verify needs at least one draft token")
    inp = _inputs(state, x, dt, A, Bm, C, D, slots, T)
    y = _out(state, slots.numel(), T)
    if not inp.rows.numel():
        return y
    cur = state.cursor[inp.slots].to(torch.int64)
    if bool((cur + T > state.capacity).any()):
        raise ValueError(f"verify: cursor + T exceeds the ring capacity {state.capacity} "
                         f"(L={state.cfg.L} + spec_tokens={state.spec_tokens}); "
                         f"max cursor {int(cur.max())}, T={T}")
    pos = cur[:, None] + torch.arange(T, device=state.device)
    _append(state, inp, pos)
    S = read_source(state, inp.slots)
    out = _readout(inp.A, S, inp.C.transpose(1, 2), *_windows(state, inp.slots, state.capacity),
                   upto=pos)
    y[inp.rows] = out.transpose(1, 2) + _skip(inp, inp.x)
    state.drafted[inp.slots] = T
    return y


def commit(state: Mamba2State, accepted: torch.Tensor, slots: torch.Tensor,
           A: torch.Tensor) -> None:
    """Accept the first ``accepted (B,)`` drafts of the last :func:`verify` per row; fold every
    full window of ``L`` records into the checkpoint exactly like :func:`flush` (same
    ``flush_index`` increment, same SR key) and move the rest to the ring's start.
    ``A`` is needed by the fold (the ring keeps ``dt``, not the decay)."""
    state = _check_state(state)
    check_tensor("A", A, (state.num_heads,), _F32, state.device)
    L = state.cfg.L
    commit_records(state, accepted, slots, lambda st, sl: _fold(
        A, read_checkpoint(st, sl), *_windows(st, sl, L), count=torch.full_like(sl, L)))


def state_value(state: Mamba2State, A: torch.Tensor, slots: torch.Tensor | None = None
                ) -> torch.Tensor:
    """fp32 state after the last committed token: the checkpoint's value folded with the
    pending records, not rounded (what the next flush would fold, before rounding)."""
    state = _check_state(state)
    if slots is None:
        slots = torch.arange(state.num_slots, device=state.device)
    rows, valid = check_slots(state, slots)
    if rows.numel() != slots.numel():
        raise ValueError("state_value needs real cache slots (no negative padding slots)")
    check_tensor("A", A, (state.num_heads,), _F32, state.device)
    return _fold(A, read_checkpoint(state, valid), *_windows(state, valid, state.cfg.L),
                 count=state.cursor[valid].to(torch.int64))


# ---------------------------------------------------------------------------------- sequences
def emulate(
    cfg: PrecisionConfig | str,
    S0: torch.Tensor | None,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    layer: int = 0,
    seed: int = 0,
    sequence: torch.Tensor | None = None,
    act_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced decode of whole sequences with exactly ``cfg``'s numerics.

    ``load_state(S0)`` (zeros when None) then :func:`decode_step` token by token, batched
    over sequences and heads, so it is bit-identical to a decode loop. ``sequence (B,)`` sets
    the SR sequence key of each row (default: the row index, i.e. slot ``b``). Returns
    ``(y (B, T, H, P) fp32, S_final (B, H, P, N) fp32)`` where ``S_final`` is
    :func:`state_value` after the last token (checkpoint folded with pending records).
    """
    cfg = parse_config(cfg)
    check_tensor("x", x, (None, None, None, None), _FLOATS, x.device)
    check_tensor("Bm", Bm, (x.shape[0], x.shape[1], None, None), _FLOATS, x.device)
    n, T, H, P = x.shape
    G, N = Bm.shape[2], Bm.shape[3]
    state = init_mamba2_state(cfg, n, H, P, N, G, layer=layer, seed=seed, act_dtype=act_dtype,
                              device=x.device, sr_sequence=sequence)
    enable_read_cache(state)  # the state is private: only the reference steps write it
    slots = torch.arange(n, device=x.device)
    load_state(state, slots, S0 if S0 is not None else torch.zeros(state.state_shape,
                                                                    device=x.device))
    check_tensor("dt", dt, (n, T, H), _F32, x.device)
    check_tensor("C", C, (n, T, G, N), _FLOATS, x.device)
    y = torch.empty(n, T, H, P, dtype=torch.float32, device=x.device)
    for t in range(T):
        y[:, t] = decode_step(state, x[:, t], dt[:, t], A, Bm[:, t], C[:, t], D, slots)
    return y, state_value(state, A, slots)


def sequential_reference(S0: torch.Tensor | None, x: torch.Tensor, dt: torch.Tensor,
                         A: torch.Tensor, Bm: torch.Tensor, C: torch.Tensor,
                         D: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain conventional recurrence in float64 (test ground truth).

    Returns ``(y (B, T, H, P), S_T (B, H, P, N))``, both float64.
    """
    f = torch.float64
    n, T, H, P = x.shape
    N = Bm.shape[-1]
    S = torch.zeros(n, H, P, N, dtype=f, device=x.device) if S0 is None else S0.to(f).clone()
    x, dt, A, Bm, C = (t.to(f) for t in (x, dt, A, Bm, C))
    Bh, Ch = expand_heads(Bm, H, dim=2), expand_heads(C, H, dim=2)
    y = torch.empty(n, T, H, P, dtype=f, device=x.device)
    for t in range(T):
        a = torch.exp(dt[:, t] * A)
        S = a[..., None, None] * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None]
        y[:, t] = (S @ Ch[:, t, :, :, None]).squeeze(-1)
    if D is not None:
        y = y + D.to(f).view(1, 1, H, 1) * x
    return y, S
