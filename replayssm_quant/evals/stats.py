"""Statistics shared by the evaluations: confidence intervals that respect autocorrelation,
KL-divergence summaries in llama.cpp's convention, log-spaced position buckets, and paired tests
for task accuracy.

Per-token drift along one sequence is strongly autocorrelated (an error in the state persists for
the head's memory length), so the i.i.d. standard error llama.cpp prints is too narrow. Means here
get a *batch-means* interval: consecutive tokens are grouped into about ``sqrt(n)`` batches (never
across documents) and the spread of the batch means gives the standard error, which stays honest
as long as the correlation length is shorter than a batch.

SciPy is imported inside the functions that need it: the CLI imports this module at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "KLD_PERCENTILES",
    "MeanCI",
    "batch_ids",
    "describe",
    "drift_stats",
    "log_buckets",
    "mcnemar",
    "mean_ci",
    "paired_bootstrap",
    "paired_difference_ci",
    "proportion_ci",
]

KLD_PERCENTILES: tuple[float, ...] = (99.9, 99.0, 95.0, 90.0, 50.0, 10.0, 5.0, 1.0, 0.1)
"""The percentiles llama.cpp's ``--kl-divergence`` prints."""


@dataclass(frozen=True)
class MeanCI:
    """A mean with its standard error and a two-sided confidence interval."""

    mean: float
    se: float
    lo: float
    hi: float
    n: int
    level: float = 0.95


def batch_ids(n: int, groups: np.ndarray | None = None, batch: int | None = None) -> np.ndarray:
    """Batch index of each of ``n`` consecutive values: runs of ``batch`` (default
    ``floor(sqrt(n))``) within each group (e.g. document), so no batch spans two groups."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    size = batch or max(1, math.isqrt(n))
    if groups is None:
        return np.arange(n, dtype=np.int64) // size
    groups = np.asarray(groups)
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    # position of each value inside its group, in the original order
    counts = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank[order] = np.arange(n) - np.repeat(starts, counts)
    offsets = np.concatenate([[0], np.cumsum((counts + size - 1) // size)[:-1]])
    return offsets[inverse] + rank // size


def mean_ci(x: Sequence[float] | np.ndarray, clusters: np.ndarray | None = None,
            level: float = 0.95) -> MeanCI:
    """Mean of ``x`` with a Student-t interval.

    ``clusters`` (one label per value) makes the standard error cluster-robust: the spread of
    the cluster means, weighted by cluster size (the batch-means estimator when the clusters
    are :func:`batch_ids`). Without clusters the values are taken as independent.
    """
    from scipy import stats as sps

    a = np.asarray(x, dtype=np.float64)
    n = a.size
    if n == 0:
        return MeanCI(math.nan, math.nan, math.nan, math.nan, 0, level)
    mean = float(a.mean())
    if clusters is None:
        if n < 2:
            return MeanCI(mean, math.nan, math.nan, math.nan, n, level)
        se = float(a.std(ddof=1) / math.sqrt(n))
        dof = n - 1
    else:
        _, inv = np.unique(np.asarray(clusters), return_inverse=True)
        k = int(inv.max()) + 1
        if k < 2:
            return MeanCI(mean, math.nan, math.nan, math.nan, n, level)
        sizes = np.bincount(inv, minlength=k).astype(np.float64)
        cmeans = np.bincount(inv, weights=a, minlength=k) / sizes
        # ratio-estimator variance of a mean over clusters of unequal size
        resid = sizes * (cmeans - mean)
        se = float(math.sqrt(k / (k - 1) * np.sum(resid**2)) / n)
        dof = k - 1
    if se == 0.0:
        return MeanCI(mean, 0.0, mean, mean, n, level)
    t = float(sps.t.ppf(0.5 + level / 2, dof))
    return MeanCI(mean, se, mean - t * se, mean + t * se, n, level)


def proportion_ci(successes: int, n: int, level: float = 0.95) -> tuple[float, float, float]:
    """``(rate, lo, hi)`` with a Wilson score interval (well-behaved near 0 and 1)."""
    from scipy import stats as sps

    if n == 0:
        return math.nan, math.nan, math.nan
    res = sps.binomtest(int(successes), int(n)).proportion_ci(confidence_level=level,
                                                                method="wilson")
    return successes / n, float(res.low), float(res.high)


def describe(x: Sequence[float] | np.ndarray, clusters: np.ndarray | None = None,
             percentiles: Sequence[float] = (50.0, 90.0, 99.0), level: float = 0.95,
             prefix: str = "") -> dict[str, float]:
    """Mean (with CI), the given percentiles (``p50`` is also reported as ``median``), min and
    max of ``x`` as a flat dict whose keys start with ``prefix``."""
    a = np.asarray(x, dtype=np.float64)
    m = mean_ci(a, clusters, level)
    out = {"n": int(a.size), "mean": m.mean, "se": m.se, "ci_lo": m.lo, "ci_hi": m.hi}
    if a.size:
        qs = np.percentile(a, list(percentiles))
        for p, q in zip(percentiles, qs, strict=True):
            out[f"p{p:g}".replace(".", "_")] = float(q)
        out["median"] = float(np.median(a))
        out["min"], out["max"] = float(a.min()), float(a.max())
    else:
        for p in percentiles:
            out[f"p{p:g}".replace(".", "_")] = math.nan
        out["median"] = out["min"] = out["max"] = math.nan
    return {f"{prefix}{k}": v for k, v in out.items()}


def drift_stats(kl: np.ndarray, same_top1: np.ndarray, dp: np.ndarray, nll_ref: np.ndarray,
                nll: np.ndarray, groups: np.ndarray | None = None,
                level: float = 0.95) -> dict[str, float]:
    """llama.cpp-style drift statistics of one set of positions.

    ``kl`` KL(ref || cand) per token (nats), ``same_top1`` whether both argmaxes agree, ``dp``
    p_cand(token) - p_ref(token) of the actual next token, ``nll_ref`` / ``nll`` its negative
    log-likelihoods; ``groups`` labels the document of each token for the batch-means CI.
    Keys: ``kl_*`` (mean, CI, percentiles, max), ``same_top1`` (+ Wilson CI), ``dp_mean``,
    ``dp_rms``, ``ppl_ref``, ``ppl``, ``ppl_ratio`` (+ CI from the paired NLL difference).
    """
    kl = np.asarray(kl, dtype=np.float64)
    n = kl.size
    clusters = batch_ids(n, groups)
    out: dict[str, float] = {"n": n}
    out |= describe(kl, clusters, (50.0, 90.0, 95.0, 99.0, 99.9), level, prefix="kl_")
    del out["kl_n"]
    same = np.asarray(same_top1, dtype=bool)
    rate, lo, hi = proportion_ci(int(same.sum()), n, level)
    out |= {"same_top1": rate, "same_top1_lo": lo, "same_top1_hi": hi}
    dp = np.asarray(dp, dtype=np.float64)
    out["dp_mean"] = float(dp.mean()) if n else math.nan
    out["dp_rms"] = float(np.sqrt(np.mean(dp**2))) if n else math.nan
    nr = np.asarray(nll_ref, dtype=np.float64)
    nc = np.asarray(nll, dtype=np.float64)
    out["ppl_ref"] = float(np.exp(nr.mean())) if n else math.nan
    out["ppl"] = float(np.exp(nc.mean())) if n else math.nan
    d = mean_ci(nc - nr, clusters, level)
    out["ppl_ratio"] = float(np.exp(d.mean)) if n else math.nan
    out["ppl_ratio_lo"] = float(np.exp(d.lo)) if n else math.nan
    out["ppl_ratio_hi"] = float(np.exp(d.hi)) if n else math.nan
    return out


def log_buckets(start: int, stop: int, first: int = 16) -> list[tuple[int, int]]:
    """Doubling position buckets ``[start, 2 start), [2 start, 4 start), ...`` covering
    ``[start, stop)``; the first edge after ``start`` is at least ``first`` (so ``start = 0``
    gives ``[0, 16), [16, 32), ...``). The last bucket ends at ``stop``."""
    if stop <= start:
        return []
    edges = [start]
    while edges[-1] < stop:
        edges.append(max(2 * edges[-1], first, edges[-1] + 1))
    edges[-1] = stop
    return list(zip(edges[:-1], edges[1:], strict=True))


def mcnemar(a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray) -> dict[str, float]:
    """Exact McNemar test of paired correctness ``a`` (e.g. reference) vs ``b`` (candidate):
    a two-sided binomial test on the discordant pairs."""
    from scipy import stats as sps

    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    only_a = int(np.sum(a & ~b))
    only_b = int(np.sum(~a & b))
    k = only_a + only_b
    p = 1.0 if k == 0 else float(sps.binomtest(only_a, k, 0.5).pvalue)
    return {"only_a": only_a, "only_b": only_b, "discordant": k, "pvalue": p}


def paired_difference_ci(ref: Sequence[bool] | np.ndarray, cand: Sequence[bool] | np.ndarray,
                         level: float = 0.95) -> tuple[float, float, float]:
    """``(cand - ref accuracy, lo, hi)`` for paired correctness with Tango's score interval
    (T. Tango, "Equivalence test and confidence interval for the difference in proportions for
    the paired-sample design", Statistics in Medicine 17:891-908, 1998).

    The interval inverts the score test of ``p_cand - p_ref = d`` with the nuisance discordance
    rate at its restricted maximum-likelihood value, so it keeps close to nominal coverage at
    small n and never collapses: 0/2 against 0/2 gives about [-0.66, 0.66] and 100 concordant
    items about [-0.037, 0.037], where a bootstrap of the differences gives [0, 0]. NaN for no
    items.
    """
    from scipy import optimize
    from scipy import stats as sps

    a = np.asarray(ref, dtype=bool)
    b = np.asarray(cand, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    n = int(a.size)
    if n == 0:
        return math.nan, math.nan, math.nan
    gain = int(np.sum(~a & b))  # the candidate right where the reference is wrong
    loss = int(np.sum(a & ~b))
    z = float(sps.norm.ppf(0.5 + level / 2))
    est = (gain - loss) / n

    def score(d: float) -> float:
        w = -gain - loss + (2 * n - gain + loss) * d
        q = (math.sqrt(max(w * w + 8 * n * loss * d * (1 - d), 0.0)) - w) / (4 * n)
        var = n * (2 * q + d * (1 - d))
        num = gain - loss - n * d
        if var > 0:
            return num / math.sqrt(var)
        return 0.0 if num == 0 else math.copysign(math.inf, num)

    eps = 1e-12
    lo = -1.0 if score(-1 + eps) <= z else optimize.brentq(lambda d: score(d) - z, -1 + eps, est)
    hi = 1.0 if score(1 - eps) >= -z else optimize.brentq(lambda d: score(d) + z, est, 1 - eps)
    return est, float(lo), float(hi)


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                     resamples: int = 10_000, level: float = 0.95,
                     seed: int = 0) -> MeanCI:
    """Mean of ``b - a`` over paired items with a percentile bootstrap interval (items are
    resampled together, so item difficulty cancels)."""
    from scipy import stats as sps

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    d = b - a
    n = d.size
    if n < 2:
        return MeanCI(float(d.mean()) if n else math.nan, math.nan, math.nan, math.nan, n, level)
    if np.all(d == d[0]):
        return MeanCI(float(d[0]), 0.0, float(d[0]), float(d[0]), n, level)
    res = sps.bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=level,
                        method="percentile", rng=np.random.default_rng(seed))
    return MeanCI(float(d.mean()), float(res.standard_error), float(res.confidence_interval.low),
                  float(res.confidence_interval.high), n, level)
