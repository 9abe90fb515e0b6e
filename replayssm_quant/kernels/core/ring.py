"""Cursor, flush-list and ring bookkeeping shared by the Mamba-2 and GDN decode steps and their
speculative commit: which rows flush this step, how cursors and flush indices advance, and the
kernel arguments of a cache's state tensors. Reference: ``ssm.replay`` (cursor and flush index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cache import ReplayCache, slot_stride
from .rounding import FMT_CODES, FMT_NONE


def fmt_code(st) -> int:
    return FMT_NONE if st is None else FMT_CODES[st.fmt]


def state_args(st, slots_dummy: torch.Tensor):
    if st is None:
        return (slots_dummy, slots_dummy, slots_dummy, 0, 0, 0)
    if st.fmt == "nvfp4" and (st.data.data_ptr() % 4 or slot_stride(st.data) % 4):
        raise ValueError("NVFP4 state data must start on a 4-byte boundary with a slot stride "
                         "divisible by 4 bytes: the kernels read it as int32 words")
    rs = st.row_scale if st.row_scale is not None else slots_dummy
    bs = st.block_scale if st.block_scale is not None else slots_dummy
    return (st.data, rs, bs, slot_stride(st.data),
            slot_stride(st.row_scale) if st.row_scale is not None else 0,
            slot_stride(st.block_scale) if st.block_scale is not None else 0)


@triton.jit
def flush_list(slots_ptr, cur_ptr, fi_ptr, list_ptr, nrows, L: tl.constexpr, RB: tl.constexpr):
    """Rows whose cursor is at L-1 this step, compacted into ``list[1:]`` as (row, flush
    index + 1) pairs with their count in ``list[0]``: the persistent flush kernel's work list
    (no host sync, fixed launch shape). The flush reads its flush index from here, not from
    the cache, so it may advance the cursors and flush indices in the same launch. RB rows at
    a time, so the compiled kernel does not depend on the batch size."""
    count = tl.zeros((), dtype=tl.int32)
    for start in range(0, nrows, RB):
        i = start + tl.arange(0, RB)
        m = i < nrows
        slot = tl.load(slots_ptr + i, mask=m, other=-1)
        ok = m & (slot >= 0)
        c = tl.load(cur_ptr + slot, mask=ok, other=0)
        fi = tl.load(fi_ptr + slot, mask=ok, other=0)  # with the cursors, not after them
        fl = ok & (c == L - 1)
        pos = count + tl.cumsum(fl.to(tl.int32), 0) - 1
        tl.store(list_ptr + 1 + 2 * pos, i, mask=fl)
        tl.store(list_ptr + 2 + 2 * pos, fi + 1, mask=fl)
        count += tl.sum(fl.to(tl.int32), 0)
    tl.store(list_ptr, count)


@triton.jit
def advance_rows(slots_ptr, cur_ptr, fi_ptr, first, stride, nrows, L: tl.constexpr,
                 RB: tl.constexpr):
    """cursor += 1 (mod L) and flush_index += 1 on rows that flush, for the RB-row blocks
    ``first, first + stride, ...`` of the batch."""
    for start in range(first * RB, nrows, stride * RB):
        i = start + tl.arange(0, RB)
        m = i < nrows
        slot = tl.load(slots_ptr + i, mask=m, other=-1)
        ok = m & (slot >= 0)
        c = tl.load(cur_ptr + slot, mask=ok, other=0)
        fl = c == L - 1
        tl.store(cur_ptr + slot, tl.where(fl, 0, c + 1), mask=ok)
        fi = tl.load(fi_ptr + slot, mask=ok, other=0)
        tl.store(fi_ptr + slot, tl.where(fl, fi + 1, fi), mask=ok)


@triton.jit
def finish_row(ticket_ptr, slot, cur_ptr, fi_ptr, c, fi_next, L: tl.constexpr,
               TILE_FIRST: tl.constexpr):
    """Count this program of cache slot ``slot`` finished (``ticket_ptr[slot]``); the row's
    last program moves its cursor on from ``c`` (and its flush index to ``fi_next`` when it
    flushed) and re-arms the counter, so the step needs no launch of its own for the advance:
    at small batch, where a launch costs microseconds, a step is one launch
    (``one_launch_default``). The values are the program's own: the advance adds no load to
    the step's tail.

    The increment is relaxed, not acquire-release: it orders nothing but this program's
    reads of the cursor and flush index before the last program's writes of them, and its
    operand depends on the values read (``inc``, always 1), so it cannot issue before they
    arrived. The stores of y and the ring need no order against it (the next launch orders
    them). Without the fences the step is 0.2-0.5 us faster at batch 1 on the H200; counting
    per head first and then per row was slower (commit a9520aa)."""
    if TILE_FIRST:
        programs = tl.num_programs(0) * tl.num_programs(1)
    else:
        programs = tl.num_programs(1) * tl.num_programs(2)
    inc = tl.where((c < 0) | (fi_next < 0), 2, 1)  # 1: a dependency on c and fi, not a count
    if tl.atomic_add(ticket_ptr + slot, inc, sem="relaxed") == programs - 1:
        tl.store(ticket_ptr + slot, 0)
        tl.store(cur_ptr + slot, tl.where(c == L - 1, 0, c + 1))
        if c == L - 1:
            tl.store(fi_ptr + slot, fi_next)


@triton.jit(do_not_specialize=["nrows"])
def _advance_kernel(slots_ptr, cur_ptr, fi_ptr, L: tl.constexpr, BLOCK: tl.constexpr, nrows):
    """cursor += 1 (mod L); flush_index += 1 on rows that flushed. Separate launch because
    every program of a row reads the cursor before any may change it."""
    advance_rows(slots_ptr, cur_ptr, fi_ptr, tl.program_id(0), tl.num_programs(0), nrows, L, BLOCK)


def advance_cursor(cache: ReplayCache, slots: torch.Tensor) -> None:
    """Move each row's cursor one record on (wrapping at L, counting the flush)."""
    n = slots.shape[0]
    _advance_kernel[(triton.cdiv(n, 256),)](slots, cache.cursor, cache.flush_index, L=cache.cfg.L,
                                            BLOCK=256, nrows=n)


@triton.jit
def _shift_ring_kernel(slots_ptr, acc_ptr, cur_ptr, fi_ptr, r_ptr, s_r, heads, inner,
                       L: tl.constexpr, CAP: tl.constexpr, BI: tl.constexpr):
    """Commit, part 2 (one ring tensor ``(slots, heads, CAP, inner)``): on rows that folded,
    move records L..cursor-1 to the ring's start."""
    b = tl.program_id(0)
    hh = tl.program_id(1)
    slot = tl.load(slots_ptr + b)
    if slot >= 0:
        c = tl.load(cur_ptr + slot) + tl.load(acc_ptr + b)
        if c >= L:
            e = tl.arange(0, BI)
            me = e < inner
            for jj in tl.static_range(CAP - L):
                m = me & ((e * 0 + jj) < c - L)
                v = tl.load(r_ptr + slot * s_r + (hh * CAP + L + jj) * inner + e, mask=m)
                tl.store(r_ptr + slot * s_r + (hh * CAP + jj) * inner + e, v, mask=m)


@triton.jit
def _commit_cursor_kernel(slots_ptr, acc_ptr, cur_ptr, fi_ptr, L: tl.constexpr,
                          BLOCK: tl.constexpr, nrows):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < nrows
    slot = tl.load(slots_ptr + i, mask=m, other=-1)
    ok = m & (slot >= 0)
    c = tl.load(cur_ptr + slot, mask=ok, other=0) + tl.load(acc_ptr + i, mask=ok, other=0)
    fold = c >= L
    tl.store(cur_ptr + slot, tl.where(fold, c - L, c), mask=ok)
    fi = tl.load(fi_ptr + slot, mask=ok, other=0)
    tl.store(fi_ptr + slot, tl.where(fold, fi + 1, fi), mask=ok)


def shift_and_commit(cache: ReplayCache, accepted: torch.Tensor, slots: torch.Tensor) -> None:
    """Shift the rings of folded rows and move every row's cursor past its accepted drafts."""
    n = slots.shape[0]
    L, cap = cache.cfg.L, cache.capacity
    if cap > L:
        for t in cache.ring.values():
            inner = t[0, 0, 0].numel()
            _shift_ring_kernel[(n, t.shape[1])](
                slots, accepted, cache.cursor, cache.flush_index, t, slot_stride(t), t.shape[1],
                inner, L=L, CAP=cap, BI=max(16, triton.next_power_of_2(inner)))
    _commit_cursor_kernel[(triton.cdiv(n, 256),)](slots, accepted, cache.cursor,
                                                  cache.flush_index, L=L, BLOCK=256, nrows=n)
