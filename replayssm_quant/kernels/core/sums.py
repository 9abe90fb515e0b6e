"""Ring and decay sums shared by the step, flush and verify kernels: suffix sums of log decays
over a row's ring records, segment sums, and the unit lower-triangular inverse of the UT
transform. Reference: the sequential loops of ``ssm.mamba2`` / ``ssm.gdn``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def log_decay_suffixes(ptr, n, last, LB: tl.constexpr, CAP: tl.constexpr = 0):
    """The n ring log-decays at ``ptr`` (``dt`` or ``g``), zero beyond n, as ``(values, after,
    total, mask)`` over ``arange(LB)``: ``after[j]`` sums the records after j and ``last`` (the
    current token's; 0 for a fold without one), ``total`` all of them. ``after`` is a reverse
    scan of the next records, as the reference's ``suffix_sums``, not ``total - cumsum``: a
    -inf log-decay (a zero decay) then gives zero weights instead of -inf - -inf = NaN, and
    large sums lose no precision to cancellation. With CAP > 0 (the ring's capacity) the
    loads cover all CAP records and do not wait for ``n`` (``ring_records``)."""
    j = tl.arange(0, LB)
    mj = j < n
    d = ring_records(ptr + j, mj, j < CAP, CAP)
    nxt = ring_records(ptr + j + 1, (j + 1) < n, (j + 1) < CAP, CAP)
    after = tl.cumsum(tl.where(j + 1 == n, last, nxt), 0, reverse=True)
    return d, after, tl.sum(d, 0) + last, mj


@triton.jit
def ring_records(ptrs, live, exists, CAP: tl.constexpr):
    """Ring values at ``ptrs``, 0.0 where ``live`` (record before the cursor) is false. With
    CAP > 0 every existing record (``exists``) is loaded and the stale ones are selected away
    afterwards (a select, so a stale NaN stays out): the load then need not wait for the
    cursor that ``live`` is computed from, which at batch 1 is a dependent memory round trip
    on the step's critical path. CAP = 0 loads the live records only."""
    if CAP > 0:
        return tl.where(live, tl.load(ptrs, mask=exists, other=0.0), 0.0)
    else:
        return tl.load(ptrs, mask=live, other=0.0)


@triton.jit
def log_decay_segments(nxt, LB: tl.constexpr):
    """``seg[i, j]`` = the log-decays of records j+1..i summed (0 where j >= i), from ``nxt``
    (LB,), record j + 1's log-decay at position j (0 past the last record): each row is a
    reverse scan of its masked next records, never a difference of prefix sums, so a -inf
    log-decay (a zero decay) gives -inf on the segments that hold it and leaves the others
    exact."""
    j = tl.arange(0, LB)
    return tl.cumsum(tl.where(j[None, :] + 1 <= j[:, None], nxt[None, :], 0.0), axis=1,
                     reverse=True)


@triton.jit
def unit_lower_inverse(M, LB: tl.constexpr, LOG_LB: tl.constexpr, PREC: tl.constexpr):
    """``(I + M)^-1`` for strictly lower-triangular ``M``: ``M^LB = 0``, so the inverse is
    ``(I - M)(I + M^2)(I + M^4)...`` with log2(LB) factors. It does not depend on the state,
    so the state-dependent part of a window is a few matrix products. ``PREC`` (the products'
    ``input_precision``) has no default: Triton 3.6 fails to compile a helper call that leaves
    a string constexpr to its default (``'str' object has no attribute 'type'``)."""
    j = tl.arange(0, LB)
    eye = (j[:, None] == j[None, :]).to(tl.float32)
    X = -M
    P = eye + X
    for _ in tl.static_range(LOG_LB - 1):
        X = tl.dot(X, X, input_precision=PREC)
        P = tl.dot(P, eye + X, input_precision=PREC)
    return P
