"""Paired statistics of task results: agreement with scipy / statsmodels on constructed cases,
bootstrap coverage, and the per-item table built from lm-eval sample logs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from replayssm_quant.evals.paired import (
    EXACT_BELOW,
    PairingError,
    compare,
    items_from_results,
    mcnemar_test,
)
from replayssm_quant.evals.stats import paired_bootstrap, proportion_ci
from replayssm_quant.evals.tasks import TASKS

statsmodels = pytest.importorskip("statsmodels")
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar  # noqa: E402
from statsmodels.stats.proportion import proportion_confint  # noqa: E402


def _pairs(both: int, ref_only: int, cand_only: int, neither: int) -> tuple[np.ndarray, ...]:
    ref = np.array([1] * both + [1] * ref_only + [0] * cand_only + [0] * neither, dtype=bool)
    cand = np.array([1] * both + [0] * ref_only + [1] * cand_only + [0] * neither, dtype=bool)
    return ref, cand


@pytest.mark.parametrize("table", [(50, 3, 1, 20), (10, 0, 0, 5), (40, 12, 11, 7), (3, 9, 2, 1),
                                   (100, 30, 12, 40), (60, 40, 41, 5), (5, 0, 7, 5)])
def test_mcnemar_agrees_with_statsmodels(table):
    both, b, c, neither = table
    ref, cand = _pairs(*table)
    got = mcnemar_test(ref, cand)
    exact = b + c < EXACT_BELOW
    want = sm_mcnemar([[both, b], [c, neither]], exact=exact, correction=True)
    assert got["method"] == ("exact" if exact else "chi2")
    assert (got["ref_only"], got["cand_only"]) == (b, c)
    if b + c:
        assert got["pvalue"] == pytest.approx(want.pvalue, rel=1e-9, abs=1e-12)
        assert got["statistic"] == pytest.approx(want.statistic, rel=1e-9)
    else:
        assert got["pvalue"] == 1.0


def test_wilson_interval_agrees_with_statsmodels():
    for k, n in ((0, 10), (3, 10), (10, 10), (137, 198), (1, 2)):
        _, lo, hi = proportion_ci(k, n)
        slo, shi = proportion_confint(k, n, alpha=0.05, method="wilson")
        assert (lo, hi) == pytest.approx((slo, shi), abs=1e-12)


def test_paired_bootstrap_matches_scipy_and_covers():
    rng = np.random.default_rng(1)
    a = rng.random(150) < 0.6
    b = np.where(rng.random(150) < 0.1, ~a, a)
    got = paired_bootstrap(a.astype(float), b.astype(float), resamples=4000, seed=7)
    want = sps.bootstrap(((b.astype(float) - a.astype(float)),), np.mean, n_resamples=4000,
                         method="percentile", rng=np.random.default_rng(7))
    assert (got.lo, got.hi) == pytest.approx((want.confidence_interval.low,
                                              want.confidence_interval.high))
    # coverage of the true difference over repeated paired samples (nominal 95%)
    p_ref, flip_down, flip_up, n, sims = 0.6, 0.08, 0.03, 200, 300
    truth = p_ref * (1 - flip_down) + (1 - p_ref) * flip_up - p_ref
    covered = 0
    for s in range(sims):
        r = np.random.default_rng(1000 + s)
        ref = r.random(n) < p_ref
        u = r.random(n)
        cand = np.where(ref, u >= flip_down, u < flip_up)
        ci = paired_bootstrap(ref.astype(float), cand.astype(float), resamples=1000, seed=s)
        covered += ci.lo <= truth <= ci.hi
    rate = covered / sims
    # binomial(300, 0.95) is within [0.915, 0.98] with probability > 0.99; percentile
    # intervals of a mean run slightly narrow, so allow a little below
    assert 0.90 <= rate <= 0.985, rate


# ----------------------------------------------------------------------------- items table
def _sample(doc_id, filt, filtered, score, resp, prompt="p"):
    from lm_eval.utils import hash_string

    return {"doc_id": doc_id, "filter": filt, "filtered_resps": [filtered],
            "resps": [[resp]], "exact_match": score, "doc_hash": f"d{doc_id}",
            "prompt_hash": hash_string(f"{prompt}{doc_id}"), "target": "(A)"}


def test_items_from_results_truncation_and_invalid():
    from lm_eval.utils import hash_string

    spec = TASKS["gpqa_diamond"]
    samples = []
    for d, (flex, score) in enumerate((("(A)", 1.0), ("[invalid]", 0.0), ("(A)", 1.0))):
        samples.append(_sample(d, "strict-match", "[invalid]", 0.0, "resp"))
        samples.append(_sample(d, "flexible-extract", flex, score, "resp"))
    res = {"samples": {"gpqa_diamond_cot_zeroshot": samples}}
    log = [{"prompt_hash": hash_string("p0"), "truncated": False, "finish": "stop",
            "gen_tokens": 5, "prompt_tokens": 9},
           {"prompt_hash": hash_string("p1"), "truncated": False, "finish": "eos",
            "gen_tokens": 5, "prompt_tokens": 9},
           {"prompt_hash": hash_string("p2"), "truncated": True, "finish": "length",
            "gen_tokens": 64, "prompt_tokens": 9}]
    items = items_from_results(res, spec, log, model="m", config="fp32",
                               config_string="ckpt=fp32,read=none,L=1", seed=0)
    assert list(items["doc_id"]) == [0, 1, 2]
    assert list(items["invalid"]) == [False, True, False]
    assert list(items["truncated"]) == [False, False, True]
    assert list(items["score_raw"]) == [1.0, 0.0, 1.0]
    assert list(items["correct"]) == [True, False, False]  # truncated is never an answer
    assert list(items["score_strict_match"]) == [0.0, 0.0, 0.0]
    # without a generation log truncation is unknown, not assumed absent
    unknown = items_from_results(res, spec, None, model="m", config="fp32",
                                 config_string="x", seed=0)
    assert unknown["truncated"].isna().all() and list(unknown["correct"]) == [True, False, True]


def _items(config: str, correct: list[bool], prompt: str = "p", task: str = "t"):
    n = len(correct)
    return pd.DataFrame({
        "model": "m", "task": task, "subtask": task, "config": config,
        "config_string": "ckpt=fp32,read=none,L=1" if config == "fp32" else "ckpt=fp32,read=nvfp4,L=16",
        "seed": 0, "doc_id": range(n), "prompt_hash": [f"{prompt}{i}" for i in range(n)],
        "answer": ["A" if c else "B" for c in correct], "score_raw": [float(c) for c in correct],
        "correct": correct, "truncated": pd.array([False] * n, dtype="boolean"),
        "invalid": [False] * n})


def test_compare_paired_numbers_and_pairing_check():
    ref = [True] * 30 + [False] * 10
    cand = [True] * 26 + [False] * 4 + [True] * 2 + [False] * 8
    items = pd.concat([_items("fp32", ref), _items("nvfp4-read/fp32", cand)])
    rows = {r["config"]: r for r in compare(items, resamples=2000)}
    c = rows["nvfp4-read/fp32"]
    assert c["n"] == 40 and c["accuracy"] == 28 / 40 and c["ref_accuracy"] == 30 / 40
    assert c["delta"] == pytest.approx(-2 / 40)
    assert (c["flips_to_wrong"], c["flips_to_right"], c["discordant"]) == (4, 2, 6)
    assert c["flip_rate"] == pytest.approx(6 / 40)
    assert c["mcnemar_p"] == pytest.approx(sps.binomtest(4, 6, 0.5).pvalue)
    assert c["delta_ci"][0] < c["delta"] < c["delta_ci"][1]
    assert rows["fp32"]["delta"] == 0.0 and rows["fp32"]["mcnemar_p"] == 1.0
    other = pd.concat([_items("fp32", ref), _items("nvfp4-read/fp32", cand, prompt="q")])
    with pytest.raises(PairingError, match="different prompts"):
        compare(other, resamples=100)


def _score_by_brute_force(ref: np.ndarray, cand: np.ndarray, d: float) -> float:
    """Tango's score statistic with the restricted MLE found numerically (no closed form)."""
    from scipy import optimize

    n = ref.size
    gain, loss = int(np.sum(~ref & cand)), int(np.sum(ref & ~cand))
    rest = n - gain - loss
    lo_q, hi_q = max(0.0, -d) + 1e-12, (1 - d) / 2 - 1e-12

    def nll(q: float) -> float:
        parts = [(gain, q + d), (loss, q), (rest, 1 - 2 * q - d)]
        return -sum(k * np.log(p) for k, p in parts if k)

    q = optimize.minimize_scalar(nll, bounds=(lo_q, hi_q), method="bounded",
                                 options={"xatol": 1e-13}).x
    return (gain - loss - n * d) / np.sqrt(n * (2 * q + d * (1 - d)))


@pytest.mark.parametrize("table", [(50, 3, 1, 20), (10, 0, 0, 5), (3, 9, 2, 1), (5, 0, 7, 5), (0, 2, 1, 1)])
def test_paired_difference_ci_inverts_the_score_test(table):
    from replayssm_quant.evals.stats import paired_difference_ci

    ref, cand = _pairs(*table)
    est, lo, hi = paired_difference_ci(ref, cand)
    assert est == pytest.approx(cand.mean() - ref.mean())
    z = sps.norm.ppf(0.975)
    for bound, want in ((lo, z), (hi, -z)):
        if -1 < bound < 1:
            assert _score_by_brute_force(ref, cand, bound) == pytest.approx(want, abs=1e-4)


def test_paired_difference_ci_does_not_collapse_at_small_n():
    """0/2 against 0/2 carries almost no information; a bootstrap says [0, 0], the score
    interval says so honestly."""
    from replayssm_quant.evals.stats import paired_difference_ci

    ref, cand = _pairs(0, 0, 0, 2)
    assert paired_bootstrap(ref.astype(float), cand.astype(float)).hi == 0.0
    _, lo, hi = paired_difference_ci(ref, cand)
    assert lo < -0.5 and hi > 0.5
    _, lo, hi = paired_difference_ci(*_pairs(50, 0, 0, 50))
    assert 0.02 < hi < 0.05 and lo == pytest.approx(-hi)


def test_paired_difference_ci_coverage():
    from replayssm_quant.evals.stats import paired_difference_ci

    rng = np.random.default_rng(1)
    for n, pa, pb, rho in [(12, 0.5, 0.4, 0.5), (30, 0.8, 0.8, 0.7), (40, 0.3, 0.45, 0.0)]:
        hits = 0
        for _ in range(400):
            u = rng.random(n)
            v = np.where(rng.random(n) < rho, u, rng.random(n))
            _, lo, hi = paired_difference_ci(u < pa, v < pb)
            hits += lo <= pb - pa <= hi
        assert hits / 400 >= 0.92, (n, pa, pb, rho, hits / 400)
