"""Anytime-valid decisions on a paired accuracy difference, so an eval can stop early.

Long-generation task items are the expensive part of an accuracy decision. A config whose items
agree with FP32's item after item is clearly inside a budget long before a fixed n runs out; one
that flips answers is clearly outside. Looking at the data after every round and stopping when the
interval clears the budget is only honest with an interval that holds at every look at once: a
*confidence sequence*.

This module uses the betting confidence sequence of Waudby-Smith and Ramdas ("Estimating means of
bounded random variables by betting", Journal of the Royal Statistical Society B 86(1):1-27, 2024;
the hedged capital process with predictable plug-in bets, their Theorem 3 and eq. 26-27). Each
paired item gives ``d = cand - ref`` in {-1, 0, 1}, mapped to ``x = (d + 1) / 2`` in [0, 1]. For
every candidate mean ``m`` two bettors wager on ``x > m`` and ``x < m``; ``m`` leaves the set once
their averaged wealth reaches ``1 / alpha``. By Ville's inequality the set covers the true mean at
every n simultaneously with probability at least ``1 - alpha``, whatever the stopping rule. The
bets shrink with the running variance estimate, so concordant items (d = 0, most of them) narrow
the set quickly: that is where the savings come from.

Decision against a budget ``b`` (the largest accuracy drop allowed, as a fraction): **pass** once
the lower bound of the difference exceeds ``-b``, **fail** once the upper bound is below ``-b``,
otherwise **undecided** (keep adding items, or report undecided at the cap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Decision", "betting_cs", "decide", "first_decision", "simulate_error_rate"]

GRID = 2001
"""Candidate means on [0, 1]: a bound is exact to 1/(GRID-1) of the x scale, 1e-3 of accuracy."""


@dataclass(frozen=True)
class Decision:
    """Where a paired difference stands after ``n`` items."""

    verdict: str  # "pass", "fail" or "undecided"
    n: int
    delta: float
    lo: float
    hi: float


def _bets(x: np.ndarray, alpha: float) -> np.ndarray:
    """Predictable bet sizes: item t bets with the variance estimate of items before it (WSR
    eq. 26-27: running mean and variance with a prior of 1/2 and 1/4 counted once)."""
    t = np.arange(1, x.size + 1, dtype=np.float64)
    mu_after = (0.5 + np.cumsum(x)) / (t + 1)
    var_after = (0.25 + np.cumsum((x - mu_after) ** 2)) / (t + 1)
    var_before = np.concatenate([[0.25], var_after[:-1]])
    return np.sqrt(2 * math.log(2 / alpha) / (var_before * t * np.log(t + 1)))


def betting_cs(ref: Sequence[bool] | np.ndarray, cand: Sequence[bool] | np.ndarray,
               alpha: float = 0.05, grid: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds of ``mean(cand) - mean(ref)`` after each of the n paired items:
    arrays of length n, valid at every n simultaneously with probability ``1 - alpha``."""
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired 1-d arrays expected, got shapes {a.shape} and {b.shape}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    x = (b - a + 1) / 2
    n = x.size
    if n == 0:
        return np.empty(0), np.empty(0)
    m = np.linspace(0.0, 1.0, grid)[None, :]
    lam = _bets(x, alpha)[:, None]
    dev = x[:, None] - m
    # Bets capped at 1/2 of what keeps wealth positive (WSR's c = 1/2): c/m and c/(1-m).
    up = np.minimum(lam, 0.5 / np.maximum(m, 1e-12))
    down = np.minimum(lam, 0.5 / np.maximum(1 - m, 1e-12))
    log_up = np.cumsum(np.log1p(up * dev), axis=0)
    log_down = np.cumsum(np.log1p(-down * dev), axis=0)
    wealth = np.logaddexp(log_up, log_down) - math.log(2)  # hedged: half on each side
    inside = wealth < math.log(1 / alpha)
    # Running intersection: a candidate once rejected stays rejected (the set only shrinks).
    inside = np.logical_and.accumulate(inside, axis=0)
    grid_d = 2 * m[0] - 1
    lo = np.full(n, np.nan)
    hi = np.full(n, np.nan)
    any_in = inside.any(axis=1)
    first = np.argmax(inside, axis=1)
    last = grid - 1 - np.argmax(inside[:, ::-1], axis=1)
    step = grid_d[1] - grid_d[0]
    lo[any_in] = np.maximum(grid_d[first[any_in]] - step, -1.0)  # widen by one grid step: safe side
    hi[any_in] = np.minimum(grid_d[last[any_in]] + step, 1.0)
    return lo, hi


def decide(ref: Sequence[bool] | np.ndarray, cand: Sequence[bool] | np.ndarray, budget: float,
           alpha: float = 0.05) -> Decision:
    """The verdict after all items given, against a drop budget (a fraction, e.g. 0.02)."""
    if not budget >= 0:
        raise ValueError(f"budget must be a fraction >= 0, got {budget}")
    a = np.asarray(ref, dtype=bool)
    b = np.asarray(cand, dtype=bool)
    lo, hi = betting_cs(a, b, alpha)
    n = a.size
    if n == 0:
        return Decision("undecided", 0, math.nan, -1.0, 1.0)
    delta = float(b.mean() - a.mean())
    verdict = "pass" if lo[-1] > -budget else "fail" if hi[-1] < -budget else "undecided"
    return Decision(verdict, n, delta, float(lo[-1]), float(hi[-1]))


def first_decision(ref: np.ndarray, cand: np.ndarray, budget: float, alpha: float,
                   looks: Sequence[int], grid: int = GRID) -> Decision:
    """The verdict at the first look (an item count) where one is reached, else at the last."""
    lo, hi = betting_cs(ref, cand, alpha, grid)
    n = len(ref)
    for k in looks:
        k = min(k, n)
        if k == 0:
            continue
        if lo[k - 1] > -budget or hi[k - 1] < -budget:
            v = "pass" if lo[k - 1] > -budget else "fail"
            return Decision(v, k, float(np.mean(cand[:k]) - np.mean(ref[:k])),
                            float(lo[k - 1]), float(hi[k - 1]))
    return Decision("undecided", n, float(np.mean(cand) - np.mean(ref)), float(lo[-1]), float(hi[-1]))


def simulate_error_rate(true_delta: float, budget: float, *, ref_acc: float = 0.6,
                        discordance: float = 0.2, n_max: int = 400, round_size: int = 20,
                        alpha: float = 0.05, trials: int = 500, seed: int = 0,
                        grid: int = GRID) -> dict[str, float]:
    """How often the round-by-round procedure reaches each verdict when the true paired
    difference is ``true_delta``: items are drawn with a reference accuracy and a discordant
    share, looked at after every ``round_size`` items up to ``n_max``.

    At ``true_delta == -budget`` (the budget's edge) any "pass" is an error, and so is any
    "fail" at ``true_delta > -budget``; both rates must stay at or below ``alpha``.
    """
    if not 0 <= discordance <= 1 or abs(true_delta) > discordance:
        raise ValueError("need |true_delta| <= discordance <= 1")
    rng = np.random.default_rng(seed)
    p_gain = (discordance + true_delta) / 2
    p_loss = (discordance - true_delta) / 2
    p_ref_right_concordant = max(ref_acc - p_loss, 0.0)
    probs = np.array([p_gain, p_loss, p_ref_right_concordant, 0.0])
    probs[3] = 1.0 - probs[:3].sum()
    if probs[3] < 0:
        raise ValueError("reference accuracy and discordance are incompatible")
    looks = list(range(round_size, n_max + 1, round_size))
    counts = {"pass": 0, "fail": 0, "undecided": 0}
    items_used = 0
    for _ in range(trials):
        kind = rng.choice(4, size=n_max, p=probs)
        ref = (kind == 1) | (kind == 2)
        cand = (kind == 0) | (kind == 2)
        d = first_decision(ref, cand, budget, alpha, looks, grid)
        counts[d.verdict] += 1
        items_used += d.n
    return {k: v / trials for k, v in counts.items()} | {"mean_items": items_used / trials,
                                                         "n_max": float(n_max)}
