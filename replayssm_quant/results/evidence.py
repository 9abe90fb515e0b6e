"""When task evidence can decide a check, and when it cannot.

A paired accuracy comparison on a handful of items, or on answers that were cut off or
unreadable, carries no information: a percentile bootstrap of 0/2 against 0/2 has zero width
and would "pass" any drop budget. So a task check is *undecided* (a third outcome next to pass
and fail, never a pass) unless

* the paired interval was computed by a method that holds its coverage at small n. The
  writers record the method per row (``delta_ci_method``); the one accepted is Tango's score
  interval for a difference of paired proportions (T. Tango, "Equivalence test and confidence
  interval for the difference in proportions for the paired-sample design", Statistics in
  Medicine 17:891-908, 1998). Rows without a method (runs from before it was recorded) are
  undecided: interval method unknown;
* the share of truncated answers and of invalid answers, of the config and of the reference,
  is at most a stated limit (:class:`Evidence`, 10% each by default);
* for a limit on the drop's bound, the interval lies on one side of the limit: a drop whose
  95% interval contains the limit is undecided (too few items to tell), a fail is a drop that
  is above the limit even at the interval's optimistic end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .model import TaskResults, TaskRow

__all__ = ["INTERVAL_METHODS", "Evidence", "decide", "undecided_reasons"]

INTERVAL_METHODS: tuple[str, ...] = ("tango-score",)
"""Paired-interval methods valid at small n (``delta_ci_method`` values)."""

INTERVAL_METRICS = ("delta_lo", "delta_hi", "drop_hi_points")
"""Task metrics that are ends of the paired interval: they need a known, valid method."""

_QUALITY_METRICS = ("n", "truncation_rate", "invalid_rate")
"""Task metrics that describe the evidence itself: judged as they are."""


@dataclass(frozen=True)
class Evidence:
    """What task evidence must satisfy before a check on it can pass or fail.

    ``max_truncation_rate`` / ``max_invalid_rate``: the largest share (a fraction) of answers
    cut off by the generation limit / with nothing the task's extraction can read, in the
    config's and the reference's rows; None switches a limit off. ``allow_undecided``: the
    gate counts undecided checks as skipped instead of failed.
    """

    max_truncation_rate: float | None = 0.10
    max_invalid_rate: float | None = 0.10
    interval_methods: tuple[str, ...] = INTERVAL_METHODS
    allow_undecided: bool = False

    def to_dict(self) -> dict:
        return {"max_truncation_rate": self.max_truncation_rate,
                "max_invalid_rate": self.max_invalid_rate,
                "interval_methods": list(self.interval_methods),
                "allow_undecided": self.allow_undecided}


def _row_reasons(row: TaskRow, ev: Evidence, *, interval: bool, who: str = "") -> list[str]:
    out: list[str] = []
    if interval:
        method = row.delta_ci_method
        if method is None:
            out.append("interval method unknown (rerun eval to record it)")
        elif method not in ev.interval_methods:
            out.append(f"interval method {method!r} is not valid at small n "
                       f"(valid: {', '.join(ev.interval_methods)})")
    for value, limit, what in ((row.truncation_rate, ev.max_truncation_rate, "truncated"),
                               (row.invalid_rate, ev.max_invalid_rate, "invalid")):
        if limit is None:
            continue
        if not math.isfinite(value):
            out.append(f"{who}share of {what} answers unknown")
        elif value > limit:
            out.append(f"{who}{100 * value:.0f}% of answers {what} (limit {100 * limit:g}%)")
    return out


def undecided_reasons(tasks: TaskResults, metric: str, config: object, task: str,
                      ev: Evidence) -> list[str]:
    """Why the evidence for ``metric`` of ``config`` on ``task`` cannot decide a check (empty
    when it can)."""
    if metric in _QUALITY_METRICS:
        return []
    is_ref = tasks.is_reference(config)  # type: ignore[arg-type]
    out: list[str] = []
    row = tasks.row(task, config)  # type: ignore[arg-type]
    if row is not None:
        out += _row_reasons(row, ev, interval=metric in INTERVAL_METRICS and not is_ref,
                            who="reference: " if is_ref else "")
    if not is_ref:
        ref = tasks.row(task, tasks.reference)
        if ref is not None:
            out += _row_reasons(ref, ev, interval=False, who="reference: ")
    return out


def _optimistic(metric: str, row: TaskRow) -> float | None:
    """The other end of the paired interval: the value the metric takes if the config is as
    good as the data allow."""
    if metric == "drop_hi_points":
        return -100.0 * row.delta_hi
    if metric == "delta_lo":
        return row.delta_hi
    return None


def decide(outcome, tasks: TaskResults, metric: str, config: object, task: str,
           ev: Evidence, *, absolute: bool = True):
    """``outcome`` of a task check, made undecided where the evidence cannot decide it.
    Errors stay errors. ``absolute``: the check's limit is not relative to another value
    (only then can the interval's other end show that a miss is undecided)."""
    if outcome.status == "error":
        return outcome
    reasons = undecided_reasons(tasks, metric, config, task, ev)
    if reasons:
        return replace(outcome, status="undecided", kind="undecided", note="; ".join(reasons))
    if outcome.status != "fail" or not absolute or tasks.is_reference(config):  # type: ignore
        return outcome
    row = tasks.row(task, config)  # type: ignore[arg-type]
    other = _optimistic(metric, row) if row is not None else None
    if other is None or not math.isfinite(other):
        return outcome
    inside = ((outcome.upper is None or other <= outcome.upper)
              and (outcome.lower is None or other >= outcome.lower))
    if inside:
        return replace(outcome, status="undecided", kind="undecided",
                       note=f"the 95% interval reaches {other:.3g}, inside the limit: too few "
                            f"items ({row.n}) to decide")
    return outcome
