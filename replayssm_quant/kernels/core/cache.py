"""The device-side replay cache of one SSM layer: checkpoint, read copy, ring and cursor.

Kernels address every tensor as ``tensor[slot]`` with a slot stride and a contiguous inner
layout, so the same kernels run on freshly allocated caches and on strided views cut from one
page per cache slot (vLLM). Layouts follow vLLM 0.33's Mamba-2 ring: ``x (H, cap, P)``,
``dt (H, cap)`` fp32 post-softplus, ``B (G, cap, N)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ...formats import canonical_format
from ...precision import PrecisionConfig

_STORAGE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp8e4m3": torch.float8_e4m3fn, "nvfp4": torch.uint8}


@dataclass
class StateTensors:
    """One stored state (checkpoint or read copy): data + optional row/block scales.

    data: ``(slots, heads, rows, d)`` (``d // 2`` bytes for nvfp4); row_scale ``(slots, heads,
    rows)`` fp32 (fp8, nvfp4); block_scale ``(slots, heads, rows, d // 16)`` E4M3 (nvfp4).
    """

    fmt: str
    data: torch.Tensor
    row_scale: torch.Tensor | None = None
    block_scale: torch.Tensor | None = None


def alloc_state(fmt: str, slots: int, heads: int, rows: int, d: int,
                device: torch.device | str) -> StateTensors:
    f = canonical_format(fmt).name
    if f == "nvfp4":
        return StateTensors(
            f, torch.zeros(slots, heads, rows, d // 2, dtype=torch.uint8, device=device),
            torch.zeros(slots, heads, rows, dtype=torch.float32, device=device),
            torch.zeros(slots, heads, rows, d // 16, dtype=torch.float8_e4m3fn, device=device))
    data = torch.zeros(slots, heads, rows, d, dtype=_STORAGE[f], device=device)
    rs = torch.zeros(slots, heads, rows, dtype=torch.float32, device=device) if f == "fp8e4m3" else None
    return StateTensors(f, data, rs)


@dataclass
class ReplayCache:
    """Everything one layer keeps per cache slot for ReplaySSM decode.

    ``ring`` maps names to ring tensors (Mamba-2: ``x``, ``dt``, ``B``; GDN: ``k``, ``u``,
    ``g`` and, when the flush recomputes u, ``v``, ``beta``). ``cursor`` counts committed
    records since the checkpoint; ``flush_index`` counts checkpoint writes (SR key; a
    conventional config without SR keeps no count, ``keeps_counters``); ``nan_count``
    accumulates NaNs written to the state; ``ticket`` counts the finished programs of each
    slot in a one-launch step, whose last program advances the slot's cursor
    (``kernels.core.ring.finish_row``).
    """

    cfg: PrecisionConfig
    kind: str
    ckpt: StateTensors
    read: StateTensors | None
    ring: dict[str, torch.Tensor]
    cursor: torch.Tensor
    flush_index: torch.Tensor
    nan_count: torch.Tensor
    capacity: int
    layer: int = 0
    seed: int = 0
    drafted: torch.Tensor | None = None  # drafts of the last verify (reference path only)
    ticket: torch.Tensor | None = None  # (slots,) int32, 0 between launches

    def __post_init__(self) -> None:
        if self.ticket is None:
            self.ticket = torch.zeros_like(self.cursor)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"ckpt": self.ckpt.data, "cursor": self.cursor, "flush_index": self.flush_index}
        out.update({f"ring.{k}": v for k, v in self.ring.items()})
        if self.read is not None:
            out["read"] = self.read.data
        return out


def _ring_capacity(cfg: PrecisionConfig, spec_tokens: int) -> int:
    """Records a slot's ring holds: a window of L plus the drafts (none for L = 1 without)."""
    return cfg.L + spec_tokens if cfg.L > 1 or spec_tokens else 0


def _new_cache(cfg: PrecisionConfig, kind: str, slots: int, heads: int, rows: int, d: int,
               ring: dict[str, torch.Tensor], cap: int, device, layer: int, seed: int) -> ReplayCache:
    """A cache around ``ring``: a fresh checkpoint (and read copy when the config has one) of
    ``heads`` x ``rows`` x ``d`` per slot, and zeroed counters."""
    return ReplayCache(
        cfg, kind, alloc_state(cfg.ckpt.name, slots, heads, rows, d, device),
        alloc_state(cfg.read.name, slots, heads, rows, d, device) if cfg.read else None,
        ring, torch.zeros(slots, dtype=torch.int32, device=device),
        torch.zeros(slots, dtype=torch.int32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device), cap, layer, seed)


def alloc_mamba2_cache(cfg: PrecisionConfig, slots: int, heads: int, head_dim: int, d_state: int,
                       groups: int, *, spec_tokens: int = 0, act_dtype=torch.bfloat16,
                       device="cuda", layer: int = 0, seed: int = 0) -> ReplayCache:
    """Allocate a Mamba-2 replay cache (ring capacity L + spec_tokens; none for L = 1)."""
    cap = _ring_capacity(cfg, spec_tokens)
    ring = {
        "x": torch.zeros(slots, heads, max(cap, 1), head_dim, dtype=act_dtype, device=device),
        "dt": torch.zeros(slots, heads, max(cap, 1), dtype=torch.float32, device=device),
        "B": torch.zeros(slots, groups, max(cap, 1), d_state, dtype=act_dtype, device=device),
    }
    return _new_cache(cfg, "mamba2", slots, heads, head_dim, d_state, ring, cap, device, layer, seed)


def alloc_gdn_cache(cfg: PrecisionConfig, slots: int, v_heads: int, d_v: int, d_k: int,
                    k_heads: int, *, spec_tokens: int = 0, act_dtype=torch.bfloat16,
                    device="cuda", layer: int = 0, seed: int = 0) -> ReplayCache:
    """Allocate a GDN replay cache; u is kept in fp32 (it feeds the recurrence unless the
    flush recomputes it), v and beta only when the flush recomputes u."""
    cap = _ring_capacity(cfg, spec_tokens)
    c = max(cap, 1)
    ring = {
        "k": torch.zeros(slots, k_heads, c, d_k, dtype=act_dtype, device=device),
        "u": torch.zeros(slots, v_heads, c, d_v, dtype=torch.float32, device=device),
        "g": torch.zeros(slots, v_heads, c, dtype=torch.float32, device=device),
    }
    if cfg.recompute_u:
        ring["v"] = torch.zeros(slots, v_heads, c, d_v, dtype=act_dtype, device=device)
        ring["beta"] = torch.zeros(slots, v_heads, c, dtype=torch.float32, device=device)
    return _new_cache(cfg, "gdn", slots, v_heads, d_v, d_k, ring, cap, device, layer, seed)


def slot_stride(t: torch.Tensor | None) -> int:
    """Elements between cache slots; the rest of each slot must be contiguous."""
    if t is None:
        return 0
    inner = t[0]
    if not inner.is_contiguous():
        raise ValueError(f"cache tensor of shape {tuple(t.shape)} must be contiguous inside a "
                         f"slot (strides {t.stride()})")
    return t.stride(0)


def state_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(StateTensors))


def cache_from_reference(state) -> ReplayCache:
    """A kernel cache that shares its tensors with a reference ``ssm`` state (same layouts),
    so kernels and the reference can be stepped side by side."""
    from ...ssm.gdn import GDNState

    def st(q):
        if q is None:
            return None
        return StateTensors(q.fmt.name, q.data, q.row_scale, q.block_scale)

    if isinstance(state, GDNState):
        ring = {"k": state.k, "u": state.u, "g": state.g}
        if state.v is not None:
            ring.update(v=state.v, beta=state.beta)
        kind = "gdn"
    else:
        ring = {"x": state.x, "dt": state.dt, "B": state.B}
        kind = "mamba2"
    cap = state.capacity if (state.cfg.L > 1 or state.spec_tokens) else 0
    return ReplayCache(state.cfg, kind, st(state.ckpt), st(state.read), ring, state.cursor,
                       state.flush_index, state.nan_count.view(1), cap, state.layer, state.seed)


def reference_state(cache: ReplayCache):
    """The pure-torch reference's state (``ssm.mamba2`` / ``ssm.gdn``) over the cache's own
    tensors, so reference steps update the cache in place: the decode entry points run the
    reference this way on devices without Triton."""
    from ...formats import QTensor, canonical_format
    from ...ssm.gdn import GDNState
    from ...ssm.mamba2 import Mamba2State
    from ...ssm.replay import make_sr_sequence

    def qt(st: StateTensors | None):
        if st is None:
            return None
        return QTensor(canonical_format(st.fmt), st.data, st.row_scale, st.block_scale)

    n = cache.cursor.shape[0]
    if cache.drafted is None:
        cache.drafted = torch.zeros(n, dtype=torch.int32, device=cache.cursor.device)
    r = cache.ring
    act = (r["x"] if cache.kind == "mamba2" else r["k"]).dtype
    common = dict(
        cfg=cache.cfg, layer=cache.layer, seed=cache.seed, ckpt=qt(cache.ckpt), read=qt(cache.read),
        cursor=cache.cursor, flush_index=cache.flush_index, nan_count=cache.nan_count.view(()),
        drafted=cache.drafted, sr_sequence=make_sr_sequence(None, n, cache.cursor.device),
        spec_tokens=max(cache.capacity - cache.cfg.L, 0), act_dtype=act)
    if cache.kind == "mamba2":
        return Mamba2State(x=r["x"], dt=r["dt"], B=r["B"], **common)
    return GDNState(k=r["k"], u=r["u"], g=r["g"], v=r.get("v"), beta=r.get("beta"), **common)


def runs_reference(t: torch.Tensor) -> bool:
    """Whether the decode entry points run the reference for inputs on ``t``'s device: any
    device but CUDA, unless Triton's interpreter is on (``TRITON_INTERPRET=1``, how the tests
    run the kernels on a CPU)."""
    import os

    return not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def reference_call(cache: ReplayCache, fn, *, advance: bool = True,
                   out: torch.Tensor | None = None):
    """Run ``fn(reference_state(cache))`` (a reference decode step, verify or commit). With
    ``advance=False`` the cursor and flush index keep their values, as the kernels leave them
    to ``advance_cursor``; ``out`` receives the result when given."""
    keep = None if advance else (cache.cursor.clone(), cache.flush_index.clone())
    y = fn(reference_state(cache))
    if keep is not None:
        cache.cursor.copy_(keep[0])
        cache.flush_index.copy_(keep[1])
    if out is not None and y is not None:
        out.copy_(y)
        return out
    return y
