"""Paired comparison of precision configs against the FP32 reference on identical task items.

A config is judged by what it changes on the *same* items, generated with the same prompts and
seeds as the reference: one GPQA-Diamond run has a standard error of ~3 points, but most items are
answered identically by both, so the paired difference is far tighter. Per (model, task, config):

* accuracy with a Wilson 95% interval;
* the paired accuracy difference to the reference with Tango's score interval
  (:func:`~replayssm_quant.evals.stats.paired_difference_ci`), which holds its coverage at the
  small n of a quick run, and a percentile bootstrap interval beside it (``delta_ci_bootstrap``),
  which collapses to zero width when every item agrees;
* McNemar's test on the discordant items: exact binomial below :data:`EXACT_BELOW` discordant
  pairs, else the continuity-corrected chi-squared (the statsmodels convention);
* flip rate (items whose correctness differs from the reference), answer-change rate;
* truncation rate (generation hit ``max_gen_toks``) and invalid-answer rate (nothing the task's
  extraction can read).

An answer cut off by ``max_gen_toks`` is not a finished answer: ``correct`` counts it as wrong even
where lm-eval's extraction happened to find the right letter (``score_raw`` keeps lm-eval's own
score, and ``accuracy_raw`` its mean), so truncation can never pass for accuracy.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

from .stats import mcnemar as exact_mcnemar
from .stats import paired_bootstrap, paired_difference_ci, proportion_ci
from .tasks import TaskSpec, extract_answer

__all__ = [
    "EXACT_BELOW",
    "ITEM_COLUMNS",
    "PairingError",
    "compare",
    "items_from_results",
    "mcnemar_test",
    "summarize_items",
]

EXACT_BELOW = 25
"""Discordant-pair count below which McNemar's test is the exact binomial test."""

ITEM_COLUMNS = (
    "model", "task", "subtask", "config", "config_string", "seed", "doc_id", "doc_hash",
    "prompt_hash", "target", "extracted", "answer", "score_raw", "invalid", "truncated", "finish",
    "gen_tokens", "prompt_tokens", "correct", "response",
)


class PairingError(ValueError):
    """A config's items do not match the reference's (different items, prompts or seeds)."""


def _clean(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def items_from_results(results: dict[str, Any], spec: TaskSpec,
                       generation_log: Sequence[dict[str, Any]] | None, *, model: str,
                       config: str, config_string: str, seed: int) -> pd.DataFrame:
    """The per-item table of one lm-eval run (``results["samples"]``).

    One row per (subtask, doc_id); the answer is the output of the task's filter
    (``spec.filter``), extra filters get ``extracted_<filter>`` / ``score_<filter>`` columns.
    ``generation_log`` (the backend's log, matched by prompt hash) supplies ``truncated``,
    ``finish`` and token counts; without it those are missing, never assumed.
    """
    by_hash: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in generation_log or ():
        by_hash[entry["prompt_hash"]].append(entry)
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for subtask, samples in sorted((results.get("samples") or {}).items()):
        for s in samples:
            key = (subtask, int(s["doc_id"]))
            row = rows.get(key)
            if row is None:
                resps = s.get("resps") or [[""]]
                response = resps[0][0] if resps and resps[0] else ""
                row = rows[key] = {
                    "model": model, "task": spec.key, "subtask": subtask, "config": config,
                    "config_string": config_string, "seed": int(seed), "doc_id": key[1],
                    "doc_hash": s.get("doc_hash"), "prompt_hash": s.get("prompt_hash"),
                    "target": str(s.get("target")), "response": response if isinstance(
                        response, str) else str(response),
                }
            filt = s.get("filter", "none")
            fr = s.get("filtered_resps") or [""]
            extracted = fr[0] if isinstance(fr, list) else fr
            extracted = extracted if isinstance(extracted, str) else str(extracted)
            score = float(s.get(spec.metric, math.nan))
            if filt == spec.filter:
                row["extracted"], row["score_raw"] = extracted, score
            else:
                row[f"extracted_{_clean(filt)}"], row[f"score_{_clean(filt)}"] = extracted, score
    out = []
    for row in rows.values():
        if "score_raw" not in row:
            raise ValueError(f"{spec.key}: no sample with filter {spec.filter!r} for "
                             f"{row['subtask']} doc {row['doc_id']}")
        answer = extract_answer(spec, row["extracted"], row["response"])
        row["answer"], row["invalid"] = answer, answer is None
        log = by_hash.get(row["prompt_hash"])
        if log:
            entry = log.pop(0) if len(log) > 1 else log[0]
            row["truncated"] = bool(entry["truncated"])
            row["finish"] = entry.get("finish")
            row["gen_tokens"] = entry.get("gen_tokens")
            row["prompt_tokens"] = entry.get("prompt_tokens")
        else:
            row["truncated"], row["finish"] = None, None
            row["gen_tokens"], row["prompt_tokens"] = None, None
        ok = row["score_raw"] > 0
        row["correct"] = bool(ok and row["truncated"] is not True)
        out.append(row)
    frame = pd.DataFrame(out)
    if frame.empty:
        return pd.DataFrame(columns=list(ITEM_COLUMNS))
    first = [c for c in ITEM_COLUMNS if c in frame.columns]
    frame = frame[first + [c for c in frame.columns if c not in first]]
    for col in ("gen_tokens", "prompt_tokens"):
        frame[col] = frame[col].astype("Int64")
    frame["truncated"] = frame["truncated"].astype("boolean")
    return frame.sort_values(["subtask", "doc_id"], ignore_index=True)


def mcnemar_test(ref: Sequence[bool] | np.ndarray, cand: Sequence[bool] | np.ndarray,
                 exact_below: int = EXACT_BELOW) -> dict[str, Any]:
    """McNemar's test of paired correctness: exact binomial when the discordant pairs are
    fewer than ``exact_below``, else chi-squared with continuity correction."""
    ex = exact_mcnemar(ref, cand)
    b, c, k = ex["only_a"], ex["only_b"], ex["discordant"]
    if k < exact_below:
        return {"ref_only": b, "cand_only": c, "discordant": k, "statistic": float(min(b, c)),
                "pvalue": ex["pvalue"], "method": "exact"}
    stat = (abs(b - c) - 1.0) ** 2 / k
    return {"ref_only": b, "cand_only": c, "discordant": k, "statistic": float(stat),
            "pvalue": float(sps.chi2.sf(stat, 1)), "method": "chi2"}


def _rate(mask: pd.Series) -> tuple[float, int, int]:
    known = mask.dropna()
    n = int(len(known))
    hits = int(known.astype(bool).sum())
    return (hits / n if n else math.nan), hits, n


def _summary(cand: pd.DataFrame, ref: pd.DataFrame | None, *, resamples: int, level: float,
             seed: int) -> dict[str, Any]:
    n = len(cand)
    correct = cand["correct"].to_numpy(dtype=bool)
    acc, lo, hi = proportion_ci(int(correct.sum()), n, level)
    trunc, n_trunc, n_known = _rate(cand["truncated"])
    inval, n_inval, _ = _rate(cand["invalid"])
    out: dict[str, Any] = {
        "n": n, "correct": int(correct.sum()), "accuracy": acc, "accuracy_ci": [lo, hi],
        "accuracy_raw": float(np.mean(cand["score_raw"].to_numpy(dtype=float) > 0)) if n
        else math.nan,
        "truncation_rate": trunc, "truncated": n_trunc, "truncation_known": n_known,
        "invalid_rate": inval, "invalid": n_inval,
    }
    if ref is None:
        return out
    rc = ref["correct"].to_numpy(dtype=bool)
    boot = paired_bootstrap(rc.astype(float), correct.astype(float), resamples=resamples,
                            level=level, seed=seed)
    _, score_lo, score_hi = paired_difference_ci(rc, correct, level)
    mc = mcnemar_test(rc, correct)
    changed = (ref["answer"].fillna("\0").to_numpy() != cand["answer"].fillna("\0").to_numpy())
    out |= {
        "ref_accuracy": float(rc.mean()) if n else math.nan,
        "delta": boot.mean, "delta_ci": [score_lo, score_hi], "delta_ci_method": "tango-score",
        "delta_ci_bootstrap": [boot.lo, boot.hi], "delta_se": boot.se,
        "mcnemar_p": mc["pvalue"], "mcnemar_method": mc["method"],
        "discordant": mc["discordant"], "flips_to_wrong": mc["ref_only"],
        "flips_to_right": mc["cand_only"], "flip_rate": mc["discordant"] / n if n else math.nan,
        "answer_change_rate": float(changed.mean()) if n else math.nan,
    }
    return out


def summarize_items(items: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """Unpaired summary of one run's items (n, accuracy + CI, truncation, invalid answers)."""
    return _summary(items, None, resamples=0, level=level, seed=0)


def compare(items: pd.DataFrame, reference: str = "fp32", *, resamples: int = 10_000,
            level: float = 0.95, seed: int = 0) -> list[dict[str, Any]]:
    """Per (model, task, config) summary against ``reference`` (a ``config`` value of
    ``items``), on the items both have. Raises :class:`PairingError` when a shared item was
    asked with a different prompt (other seed, data or template)."""
    out: list[dict[str, Any]] = []
    for (model, task), group in items.groupby(["model", "task"], sort=True):
        ref = group[group["config"] == reference].set_index(["subtask", "doc_id"]).sort_index()
        for config, cand in group.groupby("config", sort=False):
            cand = cand.set_index(["subtask", "doc_id"]).sort_index()
            row: dict[str, Any] = {"model": model, "task": task, "config": config,
                                   "config_string": str(cand["config_string"].iloc[0]),
                                   "reference": reference}
            if ref.empty:
                row |= _summary(cand.reset_index(), None, resamples=resamples, level=level,
                                seed=seed)
                row["paired"] = False
                out.append(row)
                continue
            shared = ref.index.intersection(cand.index)
            r, c = ref.loc[shared], cand.loc[shared]
            bad = (r["prompt_hash"].to_numpy() != c["prompt_hash"].to_numpy())
            if bad.any():
                where = list(shared[bad][:3])
                raise PairingError(f"{model}/{task}: config {config!r} saw different prompts than "
                                   f"{reference!r} for {int(bad.sum())} items (e.g. {where}); "
                                   "runs must share data, limit and seed")
            row |= _summary(c.reset_index(), r.reset_index(), resamples=resamples, level=level,
                            seed=seed)
            row["paired"] = True
            row["unpaired_items"] = int(len(cand) - len(shared))
            out.append(row)
    return out
