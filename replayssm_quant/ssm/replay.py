"""The ReplaySSM decode state and the helpers Mamba-2 and GDN share.

A layer's state, per cache slot, is a high-precision **checkpoint** (format ``cfg.ckpt``), an
optional low-precision **read copy** (format ``cfg.read``) and a **ring** of per-token records
with room for ``L + spec_tokens`` of them. ``cursor`` counts the records since the checkpoint.

Checkpoint writes (a flush, a conventional step, :func:`load_state`) all go through
:func:`write_checkpoint`: ``ckpt = quantize(S, cfg.ckpt, cfg.ckpt_rounding, r)`` where the
stochastic-rounding words ``r`` are keyed by ``(seed, layer, sr_sequence[slot],
flush_index[slot], element)``; then ``read = quantize(dequantize(ckpt), cfg.read, "rn")``, so
the read copy is made from the value the recurrence carries on.

Decay sums follow one rule everywhere (:func:`suffix_sums`): the decay between a record ``j``
and the token being computed is the *exclusive suffix sum* of the log-decays up to that token,
accumulated from the newest record backwards. Recent records, which carry most of the output,
get their decay with the least rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Protocol

import torch

from ..formats import QTensor, dequantize, half_words, quantize, state_sr_bits
from ..precision import PrecisionConfig, parse_config

__all__ = [
    "ACT_DTYPES",
    "ReadCache",
    "ReplayState",
    "StoredRows",
    "assign_slots",
    "check_flush_position",
    "check_row_length",
    "check_slots",
    "check_tensor",
    "commit_records",
    "enable_read_cache",
    "fill_rows",
    "load_state",
    "read_checkpoint",
    "read_source",
    "select_slots",
    "suffix_sums",
    "write_checkpoint",
]

ACT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class ReadCache:
    """The fp32 value of every slot's read source, decoded once per checkpoint write.

    Non-flush steps read the read source every token, but only a checkpoint write changes it, so
    decoding it at each read (an NVFP4 copy's unpack, table lookup and scale multiplies) repeats
    the same work ``L - 1`` times per window. :func:`write_checkpoint` marks the slots it rewrites
    stale and the next :func:`read_source` decodes just those; ``dequantize`` is elementwise, so
    the values are the ones an uncached read returns, bit for bit. ``data`` is the stored tensor
    the cache mirrors: if the state's read source is replaced, every slot goes stale.
    """

    data: torch.Tensor
    value: torch.Tensor
    fresh: torch.Tensor


@dataclass(kw_only=True)
class ReplayState:
    """One SSM layer's decode state for ``num_slots`` cache slots.

    ``layer`` and ``seed`` key the stochastic rounding. ``sr_sequence[slot]`` is the SR
    ``sequence`` key of a slot: the slot index unless an emulator maps slots elsewhere.
    ``flush_index[slot]`` counts checkpoint writes since :func:`load_state` (which writes flush
    0; every later write increments it first). It is the SR key, so a conventional config
    that rounds to nearest keeps it at 0: its writes take no key, and its kernels skip the
    count's atomics and launch. ``nan_count`` accumulates the NaNs of every
    checkpoint write (the read copy is derived from the checkpoint, so it is not counted
    twice). ``drafted[slot]`` is the number of draft records the last ``verify`` appended,
    the most a ``commit`` may accept. ``read_cache`` (off unless :func:`enable_read_cache`)
    keeps the decoded read source between checkpoint writes.
    """

    cfg: PrecisionConfig
    layer: int
    seed: int
    ckpt: QTensor
    read: QTensor | None
    cursor: torch.Tensor
    flush_index: torch.Tensor
    nan_count: torch.Tensor
    drafted: torch.Tensor
    sr_sequence: torch.Tensor
    spec_tokens: int
    act_dtype: torch.dtype
    read_cache: ReadCache | None = field(default=None, repr=False, compare=False)

    @property
    def num_slots(self) -> int:
        return int(self.cursor.shape[0])

    @property
    def capacity(self) -> int:
        """Ring length: a window of ``L`` records plus room for the drafts of one verify."""
        return self.cfg.L + self.spec_tokens

    @property
    def device(self) -> torch.device:
        return self.cursor.device

    @property
    def state_shape(self) -> tuple[int, ...]:
        """Shape of the full fp32 state, ``(num_slots, heads, rows, row_len)``."""
        return self.ckpt.shape


# ---------------------------------------------------------------------------------- validation
def check_tensor(
    name: str,
    t: object,
    shape: tuple[int | None, ...],
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
) -> torch.Tensor:
    """One clear error for a wrong type, shape, dtype or device (``None`` = any size)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(
        s is not None and s != d for s, d in zip(shape, t.shape, strict=True)
    ):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {want}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}, expected one of "
                         f"{', '.join(str(d) for d in dtypes)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the state is on {device}")
    return t


def check_row_length(cfg: PrecisionConfig, n: int, what: str) -> None:
    """NVFP4 rows hold 16-element blocks packed two elements per byte."""
    for role, fmt in (("ckpt", cfg.ckpt), ("read", cfg.read)):
        if fmt is not None and fmt.block and n % 32:
            raise ValueError(f"{what} must be a multiple of 32 when {role} is {fmt.name}; "
                             f"got {n}")


def check_slots(state: ReplayState, slots: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate batch slot indices; returns (batch rows that are not padding, their slots).

    Negative slots mark padding rows. A slot may appear once per batch: two rows writing one
    slot would race in a kernel.
    """
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
        raise ValueError("slots must be a 1-D integer tensor with one cache slot per batch row")
    if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
        raise ValueError(f"slots must be an integer tensor, got dtype {slots.dtype}")
    if slots.device != state.device:
        raise ValueError(f"slots is on {slots.device}, the state is on {state.device}")
    slots = slots.to(torch.int64)
    rows = torch.nonzero(slots >= 0).flatten()
    valid = slots[rows]
    if valid.numel():
        hi = int(valid.max())
        if hi >= state.num_slots:
            raise ValueError(f"slot {hi} is out of range for a state with {state.num_slots} slots")
        if torch.unique(valid).numel() != valid.numel():
            raise ValueError("slots contains a cache slot more than once")
    return rows, valid


def as_config(cfg: PrecisionConfig | str) -> PrecisionConfig:
    return parse_config(cfg)


def check_act_dtype(act_dtype: torch.dtype) -> None:
    if act_dtype not in ACT_DTYPES:
        raise ValueError(f"act_dtype must be one of {ACT_DTYPES}, got {act_dtype}")


def check_common(layer: int, seed: int, spec_tokens: int, num_slots: int) -> None:
    if num_slots < 1:
        raise ValueError(f"num_slots must be >= 1, got {num_slots}")
    if spec_tokens < 0:
        raise ValueError(f"spec_tokens must be >= 0, got {spec_tokens}")
    if not 0 <= layer < 2**32:
        raise ValueError(f"layer must be in [0, 2^32), got {layer}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2^63), got {seed}")


def make_sr_sequence(sr_sequence: torch.Tensor | None, num_slots: int,
                     device: torch.device) -> torch.Tensor:
    if sr_sequence is None:
        return torch.arange(num_slots, dtype=torch.int64, device=device)
    seq = torch.as_tensor(sr_sequence, device=device)
    if seq.shape != (num_slots,) or seq.dtype.is_floating_point:
        raise ValueError(f"sr_sequence must be {num_slots} integers (one per slot), "
                         f"got shape {tuple(seq.shape)} dtype {seq.dtype}")
    if seq.numel() and (int(seq.min()) < 0 or int(seq.max()) >= 2**32):
        raise ValueError("sr_sequence keys must be in [0, 2^32)")
    return seq.to(torch.int64)


def empty_checkpoints(cfg: PrecisionConfig, shape: tuple[int, ...],
                      device: torch.device) -> tuple[QTensor, QTensor | None]:
    """Zero checkpoint and read copy in their stored layouts."""
    zeros = torch.zeros(shape, dtype=torch.float32, device=device)
    ckpt = quantize(zeros, cfg.ckpt, "rn")
    ckpt.nan_count = None
    read = None
    if cfg.read is not None:
        read = quantize(zeros, cfg.read, "rn")
        read.nan_count = None
    return ckpt, read


def common_fields(cfg: PrecisionConfig, num_slots: int, layer: int, seed: int,
                  spec_tokens: int, act_dtype: torch.dtype, device: torch.device,
                  sr_sequence: torch.Tensor | None) -> dict:
    """The slot counters every state starts with."""
    return dict(
        cfg=cfg, layer=int(layer), seed=int(seed), spec_tokens=int(spec_tokens),
        act_dtype=act_dtype,
        cursor=torch.zeros(num_slots, dtype=torch.int32, device=device),
        flush_index=torch.zeros(num_slots, dtype=torch.int64, device=device),
        nan_count=torch.zeros((), dtype=torch.int64, device=device),
        drafted=torch.zeros(num_slots, dtype=torch.int32, device=device),
        sr_sequence=make_sr_sequence(sr_sequence, num_slots, device),
    )


# ---------------------------------------------------------------------------------- state I/O
class StoredRows(Protocol):
    """What a stored state holds per slot: :class:`QTensor`, or the vLLM page's state tensors."""

    data: torch.Tensor
    row_scale: torch.Tensor | None
    block_scale: torch.Tensor | None


def select_slots(q: QTensor, slots: torch.Tensor) -> QTensor:
    """The rows of ``slots`` (data and scales) as a :class:`QTensor` of the same format."""
    return QTensor(
        q.fmt, q.data[slots],
        None if q.row_scale is None else q.row_scale[slots],
        None if q.block_scale is None else q.block_scale[slots],
    )


def assign_slots(dst: StoredRows, slots: torch.Tensor, src: QTensor) -> None:
    """Write ``src`` (data and scales) into the rows of ``slots`` of ``dst``."""
    dst.data[slots] = src.data
    if dst.row_scale is not None:
        dst.row_scale[slots] = src.row_scale
    if dst.block_scale is not None:
        dst.block_scale[slots] = src.block_scale


def check_flush_position(state: ReplayState, slots: torch.Tensor, *, at_flush: bool) -> None:
    """A flush needs every row at its flush position (``cursor == L - 1``), a non-flush step
    every row before it."""
    cursor = state.cursor[slots]
    if at_flush:
        if bool((cursor != state.cfg.L - 1).any()):
            raise ValueError("flush: every row must be at its flush position (cursor == L-1)")
    elif bool((cursor >= state.cfg.L - 1).any()):
        raise ValueError("nonflush_step: a row is at its flush position (cursor == L-1)")


def fill_rows(out: torch.Tensor, rows: torch.Tensor, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``out`` with its ``rows`` set to ``compute()``; nothing is computed when no row is a real
    slot (all padding)."""
    if rows.numel():
        out[rows] = compute()
    return out


def read_checkpoint(state: ReplayState, slots: torch.Tensor) -> torch.Tensor:
    """fp32 value of the checkpoint of ``slots``: what flushes fold into."""
    return dequantize(select_slots(state.ckpt, slots))


def _source(state: ReplayState) -> QTensor:
    return state.read if state.read is not None else state.ckpt


def enable_read_cache(state: ReplayState) -> None:
    """Keep ``state``'s decoded read source between checkpoint writes (see :class:`ReadCache`).

    Only for a state whose stored rows change through :func:`write_checkpoint` alone (the
    reference steps, :func:`load_state`, ``commit``): a kernel writing the same tensors would
    leave the cache stale. An fp32 source needs no decoding and gets no cache.
    """
    q = _source(state)
    if q.fmt.name == "fp32" or state.read_cache is not None:
        return
    state.read_cache = ReadCache(
        data=q.data,
        value=torch.empty(q.shape, dtype=torch.float32, device=state.device),
        fresh=torch.zeros(state.num_slots, dtype=torch.bool, device=state.device),
    )


def read_source(state: ReplayState, slots: torch.Tensor) -> torch.Tensor:
    """fp32 value non-flush steps read: the read copy if there is one, else the checkpoint."""
    q = _source(state)
    cache = state.read_cache
    if cache is None:
        return dequantize(select_slots(q, slots))
    if cache.data is not q.data:
        cache.data = q.data
        cache.fresh.zero_()
    stale = slots[~cache.fresh[slots]]
    if stale.numel():
        cache.value[stale] = dequantize(select_slots(q, stale))
        cache.fresh[stale] = True
    return cache.value.index_select(0, slots)  # a copy, as select_slots makes; faster than [slots]


def write_checkpoint(state: ReplayState, slots: torch.Tensor, s_new: torch.Tensor) -> None:
    """Round ``s_new`` into the checkpoint of ``slots`` (SR keyed by their current flush
    index) and derive the read copy from the stored checkpoint."""
    cfg = state.cfg
    r = None
    if cfg.ckpt_rounding == "sr":
        r = state_sr_bits(tuple(s_new.shape), state.seed, state.layer,
                          sequence=state.sr_sequence[slots],
                          flush_index=state.flush_index[slots], half=half_words(cfg.ckpt))
    q = quantize(s_new, cfg.ckpt, cfg.ckpt_rounding, r)
    state.nan_count += q.nan_count
    assign_slots(state.ckpt, slots, q)
    if cfg.read is not None:
        assign_slots(state.read, slots, quantize(dequantize(q), cfg.read, "rn"))
    if state.read_cache is not None:
        state.read_cache.fresh[slots] = False


def load_state(state: ReplayState, slots: torch.Tensor, s: torch.Tensor) -> None:
    """Start new sequences in ``slots`` from the exact state ``s`` (e.g. the result of prefill).

    The write is flush 0 of those slots (``flush_index`` is reset, so a sequence's rounding
    does not depend on what its slot held before); the ring is empty afterwards.
    """
    rows, valid = check_slots(state, slots)
    if rows.numel() != slots.numel():
        raise ValueError("load_state needs real cache slots (no negative padding slots)")
    check_tensor("S", s, (slots.numel(), *state.state_shape[1:]),
                 (torch.float32, torch.float64, torch.float16, torch.bfloat16), state.device)
    state.flush_index[valid] = 0
    state.cursor[valid] = 0
    state.drafted[valid] = 0
    write_checkpoint(state, valid, s.to(torch.float32))


# ---------------------------------------------------------------------------------- ring helpers
def suffix_sums(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(exclusive suffix sums, total) of ``d`` along the last dim.

    ``excl[..., j] = sum_{i > j} d[..., i]``, accumulated from the last element backwards;
    callers zero the entries after the token being computed, so ``excl[j]`` is the log-decay
    from record ``j`` to that token and ``total`` the one from the checkpoint.
    """
    incl = torch.flip(torch.cumsum(torch.flip(d, (-1,)), -1), (-1,))
    excl = torch.cat((incl[..., 1:], torch.zeros_like(incl[..., :1])), -1)
    return excl, incl[..., 0]


def ring_put(ring: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor,
             val: torch.Tensor) -> None:
    """Write records: ``ring[slot, h, pos]`` = ``val`` (``(n, heads, ...)`` for one position per
    row, or ``(n, heads, T, ...)`` with ``pos`` of shape ``(n, T)``)."""
    heads = torch.arange(ring.shape[1], device=ring.device)
    if pos.dim() == 1:
        ring[slots[:, None], heads[None, :], pos[:, None]] = val.to(ring.dtype)
    else:
        ring[slots[:, None, None], heads[None, :, None], pos[:, None, :]] = val.to(ring.dtype)


def ring_window(ring: torch.Tensor, slots: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` records of ``slots`` as fp32, ``(n, heads, width, ...)``."""
    return ring[slots, :, :width].to(torch.float32)


def ring_shift(ring: torch.Tensor, slots: torch.Tensor, by: int) -> None:
    """Move records ``by..`` to the start of the ring (after ``by`` records were folded)."""
    cap = ring.shape[2]
    ring[slots, :, : cap - by] = ring[slots, :, by:]


def expand_heads(t: torch.Tensor, heads: int, dim: int = 1) -> torch.Tensor:
    """Group/key-head tensor -> one entry per head (head ``h`` uses group ``h // (heads // G)``)."""
    return torch.repeat_interleave(t, heads // t.shape[dim], dim=dim)


def positions(n: int, width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(width, device=device).expand(n, width)


def commit_records(
    state: ReplayState,
    accepted: object,
    slots: torch.Tensor,
    fold: Callable[[ReplayState, torch.Tensor], torch.Tensor],
) -> None:
    """Shared ``commit``: move the cursor past the accepted drafts, then while a slot holds a
    full window, ``fold`` its first ``L`` records into the checkpoint (flush index advanced
    first, as in a flush) and shift the remaining records to the ring's start."""
    rows, valid = check_slots(state, slots)
    if not isinstance(accepted, torch.Tensor) or accepted.shape != slots.shape:
        raise ValueError(f"accepted must be a tensor of shape {tuple(slots.shape)}")
    if accepted.dtype.is_floating_point or accepted.dtype == torch.bool:
        raise ValueError(f"accepted must be an integer tensor, got dtype {accepted.dtype}")
    acc = accepted.to(device=state.device, dtype=torch.int64)[rows]
    if bool((acc < 0).any()) or bool((acc > state.drafted[valid]).any()):
        raise ValueError("accepted must be between 0 and the number of drafts the last "
                         "verify appended for that slot")
    L = state.cfg.L
    state.cursor[valid] += acc.to(torch.int32)
    state.drafted[valid] = 0
    while True:
        due = valid[state.cursor[valid] >= L]
        if not due.numel():
            return
        s_new = fold(state, due)
        state.flush_index[due] += 1
        write_checkpoint(state, due, s_new)
        for ring in ring_tensors(state):
            ring_shift(ring, due, L)
        state.cursor[due] -= L


def ring_tensors(state: ReplayState) -> list[torch.Tensor]:
    """The ring tensors a state holds (those its config uses)."""
    return [t for f in fields(state)
            if f.name in _RING_FIELDS and isinstance(t := getattr(state, f.name), torch.Tensor)]


_RING_FIELDS = ("x", "dt", "B", "k", "u", "g", "v", "beta")
