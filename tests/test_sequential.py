"""The anytime-valid paired decision: bounds hold at every look, errors stay at the nominal level
under optional stopping, and concordant items decide early."""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_quant.evals.sequential import betting_cs, decide, first_decision, simulate_error_rate


def test_bounds_shrink_and_cover_the_truth():
    rng = np.random.default_rng(3)
    ref = rng.random(300) < 0.6
    cand = ref.copy()
    flip = rng.choice(300, 24, replace=False)
    cand[flip] = ~cand[flip]
    lo, hi = betting_cs(ref, cand)
    assert np.all(np.diff(lo) >= -1e-12) and np.all(np.diff(hi) <= 1e-12)  # running intersection
    d = cand.mean() - ref.mean()
    assert lo[-1] <= d <= hi[-1]
    assert hi[-1] - lo[-1] < 0.2


def test_small_n_is_undecided():
    assert decide([False, False], [False, False], budget=0.01).verdict == "undecided"
    assert decide([], [], budget=0.01).verdict == "undecided"


def test_concordant_items_pass_and_a_positive_control_fails():
    rng = np.random.default_rng(0)
    ref = rng.random(400) < 0.7
    assert decide(ref, ref.copy(), budget=0.05).verdict == "pass"
    bad = ref & (rng.random(400) < 0.5)
    assert decide(ref, bad, budget=0.05).verdict == "fail"


@pytest.mark.parametrize("bad", [dict(alpha=0.0), dict(alpha=1.5)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        betting_cs([True], [True], **bad)
    with pytest.raises(ValueError):
        decide([True], [True], budget=-1)


def test_monte_carlo_coverage_at_every_look():
    """Over 200 simulated runs the true difference leaves the sequence at any of 400 looks in at
    most ~alpha of them (time-uniform coverage, not per-look)."""
    rng = np.random.default_rng(5)
    misses = 0
    for _ in range(200):
        kind = rng.choice(4, size=400, p=[0.05, 0.10, 0.5, 0.35])  # gain, loss, both, neither
        ref = (kind == 1) | (kind == 2)
        cand = (kind == 0) | (kind == 2)
        lo, hi = betting_cs(ref, cand, grid=801)
        misses += bool(np.any((lo > -0.05) | (hi < -0.05)))
    assert misses / 200 <= 0.06


def test_error_rate_under_optional_stopping():
    edge = simulate_error_rate(-0.05, 0.05, discordance=0.15, trials=150, n_max=300, grid=801, seed=1)
    assert edge["pass"] <= 0.05
    fine = simulate_error_rate(0.0, 0.05, discordance=0.15, trials=150, n_max=300, grid=801, seed=2)
    assert fine["fail"] <= 0.05 and fine["pass"] > 0.2 and fine["mean_items"] < 300


def test_first_decision_stops_at_the_first_clear_look():
    ref = np.ones(200, dtype=bool)
    d = first_decision(ref, ref.copy(), budget=0.1, alpha=0.05, looks=range(10, 201, 10))
    assert d.verdict == "pass" and d.n < 200
