"""Gated DeltaNet ReplaySSM reference: the decode numerics every GDN kernel is checked against.

Per value head ``h`` (key head ``h // (Hv // Hk)``), state ``S`` of shape ``(V, K)``:
``S_t = a_t S_{t-1} + u_t k_t^T``, ``u_t = beta_t (v_t - a_t S_{t-1} k_t)``, ``o_t = S_t q_t``
with ``a_t = exp(g_t)``. With checkpoint ``S_c`` and ring records ``(k_j, u_j, g_j)``::

    a_t S_{t-1} k_t = G(c+1..t) S_c k_t + sum_{j<t}  G(j+1..t) u_j (k_j . k_t)
    o_t             = G(c+1..t) S_c q_t + sum_{j<=t} G(j+1..t) u_j (k_j . q_t)
    G(a..b) = exp(sum_{i=a..b} g_i)

When non-flush steps read a narrow read copy their ``u_j`` carry its error, so the ring also
keeps ``v_j, beta_j`` and the flush recomputes every ``u_j`` of the window from the checkpoint
(``cfg.recompute_u``). ``q`` and ``k`` arrive L2-normalised (``q`` already scaled). ``k`` and
``v`` are cast to the state's ``act_dtype`` on the way in (what the ring stores), so every path
sees the same values. Negative slots are padding rows (zero output, no state change).
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
    "GDNState",
    "commit",
    "conventional_step",
    "decode_step",
    "emulate",
    "flush",
    "init_gdn_state",
    "nonflush_step",
    "sequential_reference",
    "state_value",
    "verify",
]

_F32 = (torch.float32,)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(kw_only=True)
class GDNState(ReplayState):
    """GDN replay state. Ring: ``k (slots, Hk, cap, K)`` in ``act_dtype``, ``u (slots, Hv,
    cap, V)`` and ``g (slots, Hv, cap)`` fp32; with ``cfg.recompute_u`` also ``v (slots, Hv,
    cap, V)`` in ``act_dtype`` and ``beta (slots, Hv, cap)`` fp32 (else None). Checkpoint and
    read copy rows are ``K`` long."""

    k: torch.Tensor
    u: torch.Tensor
    g: torch.Tensor
    v: torch.Tensor | None
    beta: torch.Tensor | None

    @property
    def num_v_heads(self) -> int:
        return int(self.u.shape[1])

    @property
    def num_k_heads(self) -> int:
        return int(self.k.shape[1])

    @property
    def head_v_dim(self) -> int:
        return int(self.u.shape[3])

    @property
    def head_k_dim(self) -> int:
        return int(self.k.shape[3])


def init_gdn_state(
    cfg: PrecisionConfig | str,
    num_slots: int,
    num_v_heads: int,
    head_v_dim: int,
    head_k_dim: int,
    num_k_heads: int | None = None,
    *,
    layer: int = 0,
    seed: int = 0,
    spec_tokens: int = 0,
    act_dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    sr_sequence: torch.Tensor | None = None,
) -> GDNState:
    """A zero state for ``num_slots`` cache slots of one GDN layer (``num_k_heads`` defaults
    to ``num_v_heads``)."""
    cfg = as_config(cfg)
    device = torch.device(device) if device is not None else torch.device("cpu")
    num_k_heads = num_v_heads if num_k_heads is None else num_k_heads
    check_common(layer, seed, spec_tokens, num_slots)
    check_act_dtype(act_dtype)
    for name, val in (("num_v_heads", num_v_heads), ("head_v_dim", head_v_dim),
                      ("head_k_dim", head_k_dim), ("num_k_heads", num_k_heads)):
        if val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads "
                         f"({num_k_heads})")
    check_row_length(cfg, head_k_dim, "head_k_dim")
    cap = cfg.L + spec_tokens
    ckpt, read = empty_checkpoints(cfg, (num_slots, num_v_heads, head_v_dim, head_k_dim), device)
    Hv, V = num_v_heads, head_v_dim

    def z(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=device)

    return GDNState(
        ckpt=ckpt, read=read,
        k=z(num_slots, num_k_heads, cap, head_k_dim, dtype=act_dtype),
        u=z(num_slots, Hv, cap, V), g=z(num_slots, Hv, cap),
        v=z(num_slots, Hv, cap, V, dtype=act_dtype) if cfg.recompute_u else None,
        beta=z(num_slots, Hv, cap) if cfg.recompute_u else None,
        **common_fields(cfg, num_slots, layer, seed, spec_tokens, act_dtype, device,
                        sr_sequence),
    )


# ---------------------------------------------------------------------------------- inputs
@dataclass
class _Inputs:
    """Inputs of the non-padding rows, fp32; ``k``/``v`` rounded through ``act_dtype``;
    ``q``/``k`` expanded to value heads."""

    rows: torch.Tensor
    slots: torch.Tensor
    q: torch.Tensor  # (n, [T,] Hv, K)
    k: torch.Tensor  # (n, [T,] Hv, K)
    k_raw: torch.Tensor  # (n, [T,] Hk, K): what the ring stores
    v: torch.Tensor  # (n, [T,] Hv, V)
    g: torch.Tensor  # (n, [T,] Hv)
    beta: torch.Tensor  # (n, [T,] Hv)


def _check_state(state: object) -> GDNState:
    if not isinstance(state, GDNState):
        raise ValueError(f"expected a GDNState, got {type(state).__name__}")
    return state


def _inputs(state: GDNState, q, k, v, g, beta, slots, steps: int | None) -> _Inputs:
    """Validate one step's (``steps=None``) or a ``(B, T, ...)`` block's inputs."""
    rows, valid = check_slots(state, slots)
    Hv, Hk, V, K = state.num_v_heads, state.num_k_heads, state.head_v_dim, state.head_k_dim
    lead = (slots.numel(),) if steps is None else (slots.numel(), steps)
    dev = state.device
    check_tensor("q", q, (*lead, Hk, K), _FLOATS, dev)
    check_tensor("k", k, (*lead, Hk, K), _FLOATS, dev)
    check_tensor("v", v, (*lead, Hv, V), _FLOATS, dev)
    check_tensor("g", g, (*lead, Hv), _F32, dev)
    check_tensor("beta", beta, (*lead, Hv), _F32, dev)
    act = state.act_dtype
    hd = len(lead)
    k_raw = k[rows].to(act).to(torch.float32)
    return _Inputs(
        rows=rows, slots=valid,
        q=expand_heads(q[rows].to(torch.float32), Hv, dim=hd),
        k=expand_heads(k_raw, Hv, dim=hd), k_raw=k_raw,
        v=v[rows].to(act).to(torch.float32), g=g[rows], beta=beta[rows],
    )


def _subset(inp: _Inputs, idx: torch.Tensor) -> _Inputs:
    return _Inputs(inp.rows[idx], inp.slots[idx], inp.q[idx], inp.k[idx], inp.k_raw[idx],
                   inp.v[idx], inp.g[idx], inp.beta[idx])


# ---------------------------------------------------------------------------------- core math
def _decays(g_w: torch.Tensor, upto: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For tokens at ring positions ``upto (n, T)``: ``G(j+1..t)`` per record ``(n, H, T, W)``
    and ``G(c+1..t)`` ``(n, H, T)``, from the log-decays ``g_w (n, H, W)``."""
    n, _, W = g_w.shape
    mask = (positions(n, W, g_w.device)[:, None, :] <= upto[:, :, None])[:, None]
    excl, tot = suffix_sums(torch.where(mask, g_w[:, :, None, :], 0.0))
    return torch.exp(excl), torch.exp(tot)


def _combine(S: torch.Tensor, Q: torch.Tensor, k_w: torch.Tensor, u_w: torch.Tensor,
             dec: torch.Tensor, etot: torch.Tensor, rec_end: torch.Tensor) -> torch.Tensor:
    """``G(c+1..t) S Q_t + sum_{j < rec_end_t} G(j+1..t) u_j (k_j . Q_t)`` for queries
    ``Q (n, H, T, K)``; records at or after ``rec_end (n, T)`` (stale entries, later drafts)
    are masked with ``where`` per query, so a NaN there never reaches the output. Returns
    ``(n, H, T, V)``."""
    n, W = k_w.shape[0], k_w.shape[2]
    pos = positions(n, W, k_w.device)
    rec = (pos[:, None, :] < rec_end[:, :, None])[:, None]  # (n, 1, T, W)
    wgt = torch.where(rec, dec * (Q @ k_w.transpose(-1, -2)), 0.0)
    uq = torch.where(rec[..., None], u_w[:, :, None], 0.0)  # (n, H, T, W, V) per query
    return etot[..., None] * (Q @ S.transpose(-1, -2)) + (wgt.unsqueeze(-2) @ uq).squeeze(-2)


def _recompute_u(S_c: torch.Tensor, k_w: torch.Tensor, g_w: torch.Tensor, v_w: torch.Tensor,
                 beta_w: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The window's ``u_j`` recomputed in order from the checkpoint ``S_c``:
    ``u_j = beta_j (v_j - [G(c+1..j) S_c k_j + sum_{i<j} G(i+1..j) u_i (k_i . k_j)])``;
    zero for ``j >= count``."""
    n, H, W = g_w.shape
    pos = positions(n, W, g_w.device)
    dec, etot = _decays(g_w, pos)  # (n, H, W_j, W_i), (n, H, W_j)
    sk = k_w @ S_c.transpose(-1, -2)  # (n, H, W, V): S_c k_j
    m = dec * (k_w @ k_w.transpose(-1, -2))  # (n, H, W_j, W_i)
    valid = (pos < count[:, None])[:, None, :, None]  # (n, 1, W, 1)
    u = torch.zeros_like(sk)
    for j in range(W):
        w = etot[:, :, j, None] * sk[:, :, j] + (m[:, :, j : j + 1, :j] @ u[:, :, :j]).squeeze(2)
        uj = beta_w[:, :, j, None] * (v_w[:, :, j] - w)
        u[:, :, j] = torch.where(valid[:, :, j], uj, 0.0)
    return u


def _fold(S_c: torch.Tensor, k_w: torch.Tensor, u_w: torch.Tensor, g_w: torch.Tensor,
          count: torch.Tensor) -> torch.Tensor:
    """``S_c`` advanced over the first ``count (n,)`` records:
    ``G(all) S_c + sum_j G(j+1..end) u_j k_j^T`` (fp32, not rounded)."""
    n, H, W = g_w.shape
    valid = (positions(n, W, g_w.device) < count[:, None])[:, None]  # (n, 1, W)
    excl, tot = suffix_sums(torch.where(valid, g_w, 0.0))
    wgt = torch.where(valid, torch.exp(excl), 0.0)
    um = torch.where(valid[..., None], u_w, 0.0)
    km = torch.where(valid[..., None], k_w, 0.0)
    add = (wgt[..., None] * um).transpose(-1, -2) @ km  # (n, H, V, K)
    return torch.exp(tot)[..., None, None] * S_c + add


def _fold_slots(state: GDNState, slots: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Fold the first ``count`` records of ``slots`` into their checkpoint's value, with the
    window's ``u`` recomputed from the checkpoint when the config reads a copy."""
    L = state.cfg.L
    S_c = read_checkpoint(state, slots)
    k_w, u_w, g_w = _windows(state, slots, L)
    if state.cfg.recompute_u:
        u_w = _recompute_u(S_c, k_w, g_w, ring_window(state.v, slots, L),
                           ring_window(state.beta, slots, L), count)
    return _fold(S_c, k_w, u_w, g_w, count)


def _windows(state: GDNState, slots: torch.Tensor, width: int):
    k_w = expand_heads(ring_window(state.k, slots, width), state.num_v_heads)
    return k_w, ring_window(state.u, slots, width), ring_window(state.g, slots, width)


def _append(state: GDNState, inp: _Inputs, pos: torch.Tensor) -> None:
    """Write ``k, g`` (and ``v, beta`` when the flush recomputes ``u``) at ``pos``."""
    tr = (lambda t: t) if pos.dim() == 1 else (lambda t: t.transpose(1, 2))
    ring_put(state.k, inp.slots, pos, tr(inp.k_raw))
    ring_put(state.g, inp.slots, pos, tr(inp.g))
    if state.v is not None:
        ring_put(state.v, inp.slots, pos, tr(inp.v))
        ring_put(state.beta, inp.slots, pos, tr(inp.beta))


def _conventional_rows(state: GDNState, inp: _Inputs) -> torch.Tensor:
    S = read_checkpoint(state, inp.slots)
    a = torch.exp(inp.g)[..., None]  # (n, H, 1)
    sk = (S @ inp.k[..., None]).squeeze(-1)
    u = inp.beta[..., None] * (inp.v - a * sk)
    S_t = a[..., None] * S + u[..., None] * inp.k[:, :, None, :]
    o = (S_t @ inp.q[..., None]).squeeze(-1)
    if state.cfg.uses_sr:  # the SR key; a write rounded to nearest needs none
        state.flush_index[inp.slots] += 1
    write_checkpoint(state, inp.slots, S_t)
    return o


def _new_u(state: GDNState, inp: _Inputs, S: torch.Tensor, cur: torch.Tensor):
    """``u_t`` of the token at ring position ``cur`` (record already appended) read from
    ``S``; stores it. Returns ``(u_t, windows, decays)`` for the output."""
    k_w, u_w, g_w = _windows(state, inp.slots, state.cfg.L)
    dec, etot = _decays(g_w, cur[:, None])
    w = _combine(S, inp.k[:, :, None], k_w, u_w, dec, etot, rec_end=cur[:, None]).squeeze(2)
    u_t = inp.beta[..., None] * (inp.v - w)
    ring_put(state.u, inp.slots, cur, u_t)
    return u_t, k_w, u_w, dec, etot


def _nonflush_rows(state: GDNState, inp: _Inputs) -> torch.Tensor:
    cur = state.cursor[inp.slots].to(torch.int64)
    _append(state, inp, cur)
    S = read_source(state, inp.slots)
    u_t, k_w, u_w, dec, etot = _new_u(state, inp, S, cur)
    at_t = (positions(cur.numel(), u_w.shape[2], cur.device) == cur[:, None])[:, None, :, None]
    u_w = torch.where(at_t, u_t[:, :, None, :], u_w)
    o = _combine(S, inp.q[:, :, None], k_w, u_w, dec, etot, rec_end=cur[:, None] + 1)
    state.cursor[inp.slots] += 1
    state.drafted[inp.slots] = 0
    return o.squeeze(2)


def _flush_rows(state: GDNState, inp: _Inputs) -> torch.Tensor:
    L = state.cfg.L
    cur = state.cursor[inp.slots].to(torch.int64)
    _append(state, inp, cur)
    if not state.cfg.recompute_u:  # no read copy: u_t comes from the checkpoint itself
        _new_u(state, inp, read_checkpoint(state, inp.slots), cur)
    S_new = _fold_slots(state, inp.slots, torch.full_like(inp.slots, L))
    o = (S_new @ inp.q[..., None]).squeeze(-1)
    state.flush_index[inp.slots] += 1
    write_checkpoint(state, inp.slots, S_new)
    state.cursor[inp.slots] = 0
    state.drafted[inp.slots] = 0
    return o


def _out(state: GDNState, batch: int, *mid: int) -> torch.Tensor:
    return torch.zeros(batch, *mid, state.num_v_heads, state.head_v_dim, dtype=torch.float32,
                       device=state.device)


# ---------------------------------------------------------------------------------- steps
def conventional_step(state: GDNState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Read the checkpoint, advance one token, write it back (``L == 1`` configs only).

    The output uses the fp32 ``S_t`` before rounding. Returns ``o (B, Hv, V)``.
    """
    state = _check_state(state)
    if state.cfg.L != 1:
        raise ValueError(f"conventional_step needs a config with L=1, got L={state.cfg.L}")
    inp = _inputs(state, q, k, v, g, beta, slots, None)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _conventional_rows(state, inp))


def nonflush_step(state: GDNState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  g: torch.Tensor, beta: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """A step that computes ``u_t`` and the output from the read source and the ring and
    appends its record; never writes the state. Every row must have ``cursor < L - 1``."""
    state = _check_state(state)
    inp = _inputs(state, q, k, v, g, beta, slots, None)
    check_flush_position(state, inp.slots, at_flush=False)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _nonflush_rows(state, inp))


def flush(state: GDNState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The step whose record lands at position ``L - 1``: fold all ``L`` records into the
    checkpoint's value (``u`` recomputed from it when the config reads a copy), output
    ``S_new q_t`` from the fp32 result, write checkpoint and read copy. Every row must have
    ``cursor == L - 1``."""
    state = _check_state(state)
    inp = _inputs(state, q, k, v, g, beta, slots, None)
    check_flush_position(state, inp.slots, at_flush=True)
    return fill_rows(_out(state, slots.numel()), inp.rows, lambda: _flush_rows(state, inp))


def decode_step(state: GDNState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, beta: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One decode token per row: a flush where ``cursor == L - 1``, else a non-flush step
    (rows may mix); ``conventional_step`` when ``L == 1``. Returns ``o (B, Hv, V)``."""
    state = _check_state(state)
    inp = _inputs(state, q, k, v, g, beta, slots, None)
    o = _out(state, slots.numel())
    if not inp.rows.numel():
        return o
    if state.cfg.L == 1:
        o[inp.rows] = _conventional_rows(state, inp)
        return o
    at_flush = state.cursor[inp.slots] == state.cfg.L - 1
    nf = torch.nonzero(~at_flush).flatten()
    fl = torch.nonzero(at_flush).flatten()
    for idx, rows_fn in ((nf, _nonflush_rows), (fl, _flush_rows)):
        if idx.numel():  # rows in step (the usual case) need no copy of their inputs
            sub = inp if idx.numel() == inp.rows.numel() else _subset(inp, idx)
            o[sub.rows] = rows_fn(state, sub)
    return o


def verify(state: GDNState, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           g: torch.Tensor, beta: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Append ``T`` draft records after the committed ones and compute their ``u`` and
    outputs at once in chunk form from the read source; the cursor does not move.

    Inputs are stacked on dim 1 (``q (B, T, Hk, K)``, ...); returns ``o (B, T, Hv, V)``.
    The draft ``u``'s solve the unit lower-triangular system (the UT transform)
    ``u_t + beta_t sum_{s<t} G(s+1..t) (k_s . k_t) u_s = beta_t (v_t - w_t^committed)``.
    In exact arithmetic this equals sequential decoding. In floating point the outputs up
    to and including the last non-flush position of the window match it to fp32 rounding;
    a draft at a flush position (and any after it) reads the old read source plus the
    records instead of the flushed checkpoint / new read copy. Its ``u`` does too: once
    committed past a fold it stays in the ring and feeds the next window's outputs until
    the next fold, which recomputes it from the checkpoint when the config has a read copy
    (without one it is folded as computed, so the state differs from sequential decoding
    at the checkpoint format's precision).
    """
    state = _check_state(state)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError("verify: q must be (B, T, Hk, K)")
    T = int(q.shape[1])
    if T < 1:
        raise ValueError("verify needs at least one draft token")
    inp = _inputs(state, q, k, v, g, beta, slots, T)
    o = _out(state, slots.numel(), T)
    if not inp.rows.numel():
        return o
    cur = state.cursor[inp.slots].to(torch.int64)
    if bool((cur + T > state.capacity).any()):
        raise ValueError(f"verify: cursor + T exceeds the ring capacity {state.capacity} "
                         f"(L={state.cfg.L} + spec_tokens={state.spec_tokens}); "
                         f"max cursor {int(cur.max())}, T={T}")
    n, dev = cur.numel(), state.device
    pos = cur[:, None] + torch.arange(T, device=dev)
    _append(state, inp, pos)
    S = read_source(state, inp.slots)
    k_w, u_w, g_w = _windows(state, inp.slots, state.capacity)
    dec, etot = _decays(g_w, pos)  # (n, H, T, W), (n, H, T)
    kd, qd, vd = inp.k.transpose(1, 2), inp.q.transpose(1, 2), inp.v.transpose(1, 2)
    bd = inp.beta.transpose(1, 2)  # (n, H, T)
    H = bd.shape[1]
    w_c = _combine(S, kd, k_w, u_w, dec, etot, rec_end=cur[:, None].expand(n, T))
    rhs = bd[..., None] * (vd - w_c)
    dec_dd = dec.gather(-1, pos[:, None, None, :].expand(n, H, T, T))
    strict = torch.ones(T, T, dtype=torch.bool, device=dev).tril(-1)
    m = torch.where(strict, bd[..., None] * (dec_dd * (kd @ kd.transpose(-1, -2))), 0.0)
    m = m + torch.eye(T, dtype=torch.float32, device=dev)
    u_d = torch.linalg.solve_triangular(m, rhs, upper=False, unitriangular=True)
    ring_put(state.u, inp.slots, pos, u_d)
    u_w = ring_window(state.u, inp.slots, state.capacity)
    out = _combine(S, qd, k_w, u_w, dec, etot, rec_end=pos + 1)
    o[inp.rows] = out.transpose(1, 2)
    state.drafted[inp.slots] = T
    return o


def commit(state: GDNState, accepted: torch.Tensor, slots: torch.Tensor) -> None:
    """Accept the first ``accepted (B,)`` drafts of the last :func:`verify` per row; fold every
    full window of ``L`` records into the checkpoint exactly like :func:`flush` (same
    ``flush_index`` increment, same SR key, ``u`` recomputed when the config reads a copy)
    and move the rest to the ring's start."""
    state = _check_state(state)
    commit_records(state, accepted, slots,
                   lambda st, sl: _fold_slots(st, sl, torch.full_like(sl, st.cfg.L)))


def state_value(state: GDNState, slots: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 state after the last committed token: the checkpoint's value folded with the
    pending records exactly as the next flush would (``u`` recomputed from the checkpoint
    when the config reads a copy), not rounded. The state is not modified."""
    state = _check_state(state)
    if slots is None:
        slots = torch.arange(state.num_slots, device=state.device)
    rows, valid = check_slots(state, slots)
    if rows.numel() != slots.numel():
        raise ValueError("state_value needs real cache slots (no negative padding slots)")
    return _fold_slots(state, valid, state.cursor[valid].to(torch.int64))


# ---------------------------------------------------------------------------------- sequences
def emulate(
    cfg: PrecisionConfig | str,
    S0: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
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
    ``(o (B, T, Hv, V) fp32, S_final (B, Hv, V, K) fp32)`` where ``S_final`` is
    :func:`state_value` after the last token.
    """
    cfg = parse_config(cfg)
    check_tensor("k", k, (None, None, None, None), _FLOATS, k.device)
    check_tensor("v", v, (k.shape[0], k.shape[1], None, None), _FLOATS, k.device)
    n, T, Hk, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    state = init_gdn_state(cfg, n, Hv, V, K, Hk, layer=layer, seed=seed, act_dtype=act_dtype,
                           device=k.device, sr_sequence=sequence)
    enable_read_cache(state)  # the state is private: only the reference steps write it
    slots = torch.arange(n, device=k.device)
    load_state(state, slots, S0 if S0 is not None else torch.zeros(state.state_shape,
                                                                    device=k.device))
    check_tensor("q", q, (n, T, Hk, K), _FLOATS, k.device)
    check_tensor("g", g, (n, T, Hv), _F32, k.device)
    check_tensor("beta", beta, (n, T, Hv), _F32, k.device)
    o = torch.empty(n, T, Hv, V, dtype=torch.float32, device=k.device)
    for t in range(T):
        o[:, t] = decode_step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], slots)
    return o, state_value(state, slots)


def sequential_reference(S0: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain conventional delta-rule recurrence in float64 (test ground truth).

    Returns ``(o (B, T, Hv, V), S_T (B, Hv, V, K))``, both float64.
    """
    f = torch.float64
    n, T, _, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    S = torch.zeros(n, Hv, V, K, dtype=f, device=k.device) if S0 is None else S0.to(f).clone()
    q, k = (expand_heads(t.to(f), Hv, dim=2) for t in (q, k))
    v, g, beta = (t.to(f) for t in (v, g, beta))
    o = torch.empty(n, T, Hv, V, dtype=f, device=k.device)
    for t in range(T):
        a = torch.exp(g[:, t])[..., None]
        sk = (S @ k[:, t, ..., None]).squeeze(-1)
        u = beta[:, t, :, None] * (v[:, t] - a * sk)
        S = a[..., None] * S + u[..., None] * k[:, t, :, None, :]
        o[:, t] = (S @ q[:, t, ..., None]).squeeze(-1)
    return o, S
