"""How the plugin drives the project's kernels on vLLM's pages; imports no vLLM.

The vLLM layers call these functions with the tensors vLLM hands its own kernels, and the GPU
check (``benchmarks/vllm_page_graph.py``) calls the same functions on pages it lays out the same
way, so what runs on the H200 without vLLM is exactly what runs inside it:

* :func:`cache_from_page` cuts a :class:`~replayssm_quant.kernels.cache.ReplayCache` out of the
  int8 pages (one per cache slot) with :class:`~.layout.PageLayout`'s offsets.
* :func:`refresh_after_prefill` writes the checkpoint of freshly prefilled slots (flush 0, SR
  keyed like the reference's ``load_state``), their read copy, and zeroes their cursor.
* :func:`mamba2_decode` / :func:`gdn_decode` turn vLLM's decode inputs into the kernels' inputs
  (post-softplus ``dt``, gates, normalised ``q``/``k``, slots with padding rows as ``-1``) and
  run one step. Only device ops with shapes fixed by the batch size: CUDA-graph safe.

Cursor and flush index are dense ``(num_slots,)`` int32 tensors beside the page: the kernels
address them as ``ptr + slot`` (no slot stride).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..formats import QTensor, canonical_format, dequantize, half_words, quantize, state_sr_bits
from ..kernels import gdn as gdn_kernels
from ..kernels import mamba2 as mamba2_kernels
from ..kernels.core.cache import ReplayCache, StateTensors
from ..precision import PrecisionConfig
from ..ssm.replay import assign_slots, select_slots
from .layout import PageLayout

__all__ = [
    "cache_from_page",
    "continued_state",
    "dequantize_checkpoint",
    "gdn_decode",
    "gdn_gates",
    "l2norm",
    "mamba2_decode",
    "refresh_after_prefill",
    "slots_from_indices",
]


def page_view(pages: torch.Tensor, layout: PageLayout, name: str) -> torch.Tensor:
    """``(num_slots, *shape)`` view of tensor ``name`` in ``pages`` (int8, one row per slot)."""
    part = layout.part(name)
    if pages.dim() != 2 or pages.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"pages must be a 2-D int8 tensor (slots, bytes), got "
                         f"{tuple(pages.shape)} {pages.dtype}")
    if pages.stride(1) != 1 or pages.shape[1] < layout.page_bytes:
        raise ValueError(f"pages rows must be contiguous and >= {layout.page_bytes} bytes")
    if pages.stride(0) % 16:
        raise ValueError(f"page stride {pages.stride(0)} B is not a multiple of 16")
    raw = pages[:, part.offset: part.offset + part.nbytes]
    return raw.view(part.dtype).view(pages.shape[0], *part.shape)


def _state(pages: torch.Tensor, layout: PageLayout, prefix: str, fmt: str) -> StateTensors:
    def opt(name: str) -> torch.Tensor | None:
        return page_view(pages, layout, name) if layout.has(name) else None

    return StateTensors(fmt, page_view(pages, layout, f"{prefix}.data"),
                        opt(f"{prefix}.row_scale"), opt(f"{prefix}.block_scale"))


def cache_from_page(layout: PageLayout, pages: torch.Tensor, cfg: PrecisionConfig, *,
                    cursor: torch.Tensor, flush_index: torch.Tensor, nan_count: torch.Tensor,
                    layer: int, seed: int) -> ReplayCache:
    """The kernels' view of one layer's pages. ``cursor``/``flush_index``: ``(num_slots,)``
    int32; ``nan_count``: ``(1,)`` int32 accumulated over the layer's checkpoint writes."""
    n = pages.shape[0]
    for name, t in (("cursor", cursor), ("flush_index", flush_index)):
        if t.shape != (n,) or t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous ({n},) int32 tensor")
    ring = {p.name[5:]: page_view(pages, layout, p.name)
            for p in layout.parts if p.name.startswith("ring.")}
    read = (_state(pages, layout, "read", cfg.read.name) if cfg.read is not None else None)
    return ReplayCache(cfg, layout.kind, _state(pages, layout, "ckpt", cfg.ckpt.name), read,
                       ring, cursor, flush_index, nan_count, layout.capacity, layer, seed)


def _as_qtensor(st: StateTensors) -> QTensor:
    """The page's state tensors as the reference's :class:`QTensor` (no copy)."""
    return QTensor(canonical_format(st.fmt), st.data, st.row_scale, st.block_scale)


def dequantize_checkpoint(cache: ReplayCache, slots: torch.Tensor) -> torch.Tensor:
    """fp32 value of the checkpoint of ``slots``."""
    return dequantize(select_slots(_as_qtensor(cache.ckpt), slots.long()))


def reference_view(cache: ReplayCache):
    """The reference's state object over the page's own tensors (no copy), so the reference's
    functions can read a slot's pending records where the kernels left them."""
    from ..ssm.gdn import GDNState
    from ..ssm.mamba2 import Mamba2State

    def qt(st: StateTensors | None) -> QTensor | None:
        return None if st is None else _as_qtensor(st)

    n = cache.cursor.shape[0]
    device = cache.cursor.device
    zeros = torch.zeros(n, dtype=torch.int32, device=device)
    common = dict(cfg=cache.cfg, layer=cache.layer, seed=cache.seed, ckpt=qt(cache.ckpt),
                  read=qt(cache.read), cursor=cache.cursor, flush_index=cache.flush_index,
                  nan_count=cache.nan_count, drafted=zeros,
                  sr_sequence=torch.arange(n, device=device), spec_tokens=0)
    r = cache.ring
    if cache.kind == "mamba2":
        return Mamba2State(act_dtype=r["x"].dtype, x=r["x"], dt=r["dt"], B=r["B"], **common)
    return GDNState(act_dtype=r["k"].dtype, k=r["k"], u=r["u"], g=r["g"], v=r.get("v"),
                    beta=r.get("beta"), **common)


def continued_state(cache: ReplayCache, slots: torch.Tensor,
                    A: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 state a prefill chunk continues from: the checkpoint's value folded with the records
    still in the ring (vLLM runs a one-token chunk on the decode path, which appends a record),
    exactly as the next flush would fold them. ``A`` (Mamba-2): per-head fp32 decay rates."""
    slots = slots.long()
    if cache.capacity == 0:
        return dequantize_checkpoint(cache, slots)
    from ..ssm import gdn as gdn_ref
    from ..ssm import mamba2 as mamba2_ref

    view = reference_view(cache)
    if cache.kind == "mamba2":
        return mamba2_ref.state_value(view, A.to(torch.float32).contiguous(), slots)
    return gdn_ref.state_value(view, slots)


def refresh_after_prefill(cache: ReplayCache, slots: torch.Tensor, state: torch.Tensor) -> None:
    """Start decoding ``slots`` from the exact fp32 ``state`` a prefill produced.

    The checkpoint write is flush 0 of the slot (SR words keyed by ``(seed, layer, slot, 0,
    element)``, as the reference's ``load_state``); the read copy is made from the stored
    checkpoint; cursor and flush index restart at 0 (the ring is empty). Runs on prefill rows
    only, outside CUDA graphs.
    """
    slots = slots.long()
    if not slots.numel():
        return
    cfg = cache.cfg
    state = state.to(torch.float32)
    r = None
    if cfg.uses_sr:
        r = state_sr_bits(tuple(state.shape), cache.seed, cache.layer, sequence=slots,
                          flush_index=torch.zeros_like(slots), half=half_words(cfg.ckpt))
    q = quantize(state, cfg.ckpt, cfg.ckpt_rounding, r)
    assign_slots(cache.ckpt, slots, q)
    if cache.read is not None:
        assign_slots(cache.read, slots, quantize(dequantize(q), cfg.read, "rn"))
    cache.cursor[slots] = 0
    cache.flush_index[slots] = 0
    cache.nan_count += q.nan_count.to(cache.nan_count.dtype)


def slots_from_indices(indices: torch.Tensor, rows: int, valid_rows: int | None = None
                       ) -> torch.Tensor:
    """vLLM state indices -> kernel slots: ``(rows,)`` int32, ``-1`` for padding rows.

    vLLM pads CUDA-graph batches with the null block (index 0, never a request's block) and
    uses negative ids elsewhere; rows at or past ``valid_rows`` are padding too.
    """
    idx = indices.reshape(indices.shape[0], -1)[:rows, 0]
    if idx.shape[0] != rows:
        raise ValueError(f"{idx.shape[0]} state indices for {rows} decode rows")
    keep = idx > 0
    if valid_rows is not None and valid_rows < rows:
        keep = keep & (torch.arange(rows, device=idx.device) < valid_rows)
    return torch.where(keep, idx, torch.full_like(idx, -1)).to(torch.int32).contiguous()


def _zero_padding(y: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Padding rows are left unwritten by the kernels; give them zeros, as vLLM's do."""
    return torch.where((slots >= 0)[:, None, None], y, torch.zeros((), dtype=y.dtype,
                                                                   device=y.device))


def _per_head(t: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """vLLM expands per-head parameters along head_dim (and d_state) with stride 0; take one."""
    if t is None:
        return None
    while t.dim() > 1:
        t = t[..., 0]
    if t.shape != (heads,):
        raise ValueError(f"expected a per-head tensor of {heads} entries, got {tuple(t.shape)}")
    return t.to(torch.float32).contiguous()


def mamba2_decode(cache: ReplayCache, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                  B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
                  dt_bias: torch.Tensor | None, *, dt_softplus: bool,
                  state_indices: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One Mamba-2 decode step from vLLM's ``selective_state_update`` arguments.

    x ``(rows, H, P)``; dt ``(rows, H)`` or expanded ``(rows, H, P)`` before bias/softplus;
    A expanded ``(H, P, N)`` or ``(H,)``; B/C ``(rows, G, N)``; D and dt_bias ``(H, P)`` or
    ``(H,)``. Writes ``out`` (cast to its dtype) when given; returns the fp32 output.
    """
    rows, H = x.shape[0], x.shape[1]
    dt_h = dt[..., 0] if dt.dim() == 3 else dt
    dt_h = dt_h.to(torch.float32)
    if dt_bias is not None:
        dt_h = dt_h + _per_head(dt_bias, H)
    if dt_softplus:
        dt_h = F.softplus(dt_h)
    slots = slots_from_indices(state_indices, rows)
    y = mamba2_kernels.mamba2_decode_step(
        cache, x.contiguous(), dt_h.contiguous(), _per_head(A, H), B.contiguous(),
        C.contiguous(), _per_head(D, H), slots)
    y = _zero_padding(y, slots)
    if out is not None:
        out.copy_(y.view(out.shape))
    return y


def l2norm(t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fp32 ``t / sqrt(sum(t^2) + eps)`` over the last dim, as vLLM's GDN kernels normalise."""
    t = t.to(torch.float32)
    return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + eps)


def gdn_gates(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor, *,
              softplus_beta: float = 1.0, threshold: float = 20.0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta): log-decay ``-exp(A_log) * softplus(a + dt_bias)`` and ``sigmoid(b)``, fp32."""
    x = a.to(torch.float32) + dt_bias.to(torch.float32)
    sp = F.softplus(x, beta=softplus_beta, threshold=threshold)
    g = -torch.exp(A_log.to(torch.float32)) * sp
    return g.contiguous(), torch.sigmoid(b.to(torch.float32)).contiguous()


def gdn_decode(cache: ReplayCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               g: torch.Tensor, beta: torch.Tensor, *, state_indices: torch.Tensor,
               scale: float, normalize: bool, valid_rows: int | None = None) -> torch.Tensor:
    """One GDN decode step, one token per row: q/k ``(rows, Hk, K)``, v ``(rows, Hv, V)``,
    g/beta ``(rows, Hv)`` fp32 (see :func:`gdn_gates`). Returns fp32 ``(rows, Hv, V)``.

    ``k`` is normalised and rounded to the ring's dtype before the step, so the token the step
    uses is the one the ring keeps (as in the reference); ``q`` is normalised and scaled in fp32.
    """
    rows = q.shape[0]
    qn = l2norm(q) if normalize else q.to(torch.float32)
    kn = l2norm(k) if normalize else k.to(torch.float32)
    ring_dtype = cache.ring["k"].dtype if "k" in cache.ring else v.dtype
    kn = kn.to(ring_dtype)
    slots = slots_from_indices(state_indices, rows, valid_rows)
    o = gdn_kernels.gdn_decode_step(cache, (qn * scale).contiguous(), kn.contiguous(),
                                    v.contiguous(), g, beta, slots)
    return _zero_padding(o, slots)
