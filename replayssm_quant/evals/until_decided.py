"""``eval --until-decided``: add items in rounds, stop each config once its accuracy is decided.

Per task, the reference and every config run at ``n = round`` items (per subtask: per subject,
per RULER subtask and length), then each config still open gets the verdict of
:func:`~replayssm_quant.evals.sequential.decide` on its items paired with the reference's:
the anytime-valid betting confidence sequence of the paired difference ``cand - ref`` against
the drop budget (pass / fail / undecided). Decided configs stop; the rest and the reference
grow by ``round`` until every config is decided or ``n`` reaches the cap (``--limit``). The
confidence sequence holds at every look at once, so stopping at the first decisive look keeps
its error rate at ``alpha``.

Rounds are cheap because a run redone with a larger limit answers its earlier prompts from its
own ``generations.jsonl`` (:mod:`.suite`) and generates only the new items. The order in which
the sequence sees items is fixed before any answer: by position within its subtask, then by
subtask, so the items of round ``k`` are a prefix of those of round ``k + 1`` (the generated
tasks build their first ``n`` items the same way whatever the count).

The folder stays what ``recommend`` / ``report`` / ``gate`` read: the usual runs, and a final
``summary.json`` / ``items.parquet`` in which configs decided early simply have fewer items
(pairing uses the items shared with the reference). ``sequential.json`` records, per task and
config, the verdict, the n at the decision, the bounds, every look, and the generations used
against the fixed-n run at the cap. Rerunning the same command continues from it; other
options start the plan over (still reusing what the run folders hold).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..precision import PrecisionConfig
from . import suite
from .paired import PairingError
from .sequential import Decision, decide

__all__ = ["FILE", "SequentialPlan", "SequentialResult", "replay_fixed_run", "run_until_decided"]

FILE = "sequential.json"
METHOD = ("betting confidence sequence of the paired difference cand - ref (Waudby-Smith & "
          "Ramdas, JRSS-B 86(1), 2024): pass once its lower bound is above -budget, fail once "
          "its upper bound is below -budget, looked at after every round")


@dataclass(frozen=True)
class SequentialPlan:
    """How items are added and judged: ``round_size`` items per subtask per round, up to
    ``cap``; ``budget_points`` the accuracy drop allowed (points); ``alpha`` the error rate."""

    round_size: int = 20
    cap: int = 100
    budget_points: float = 1.0
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.round_size < 1:
            raise ValueError(f"--round must be >= 1, got {self.round_size}")
        if self.cap < self.round_size:
            raise ValueError(f"--limit (the cap, {self.cap}) must be >= --round "
                             f"({self.round_size})")
        if not 0 < self.alpha < 1:
            raise ValueError(f"--alpha must lie in (0, 1), got {self.alpha}")
        if not (math.isfinite(self.budget_points) and 0 <= self.budget_points < 100):
            raise ValueError(f"--budget-points must lie in [0, 100), got {self.budget_points}")

    def looks(self) -> list[int]:
        """The item counts looked at: every multiple of the round, and the cap."""
        out = list(range(self.round_size, self.cap + 1, self.round_size))
        return out if out[-1] == self.cap else [*out, self.cap]


@dataclass
class SequentialResult:
    """The state of the plan (what ``sequential.json`` holds) and the final summary."""

    out: Path
    state: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def generations(self) -> dict[str, Any]:
        return self.state["generations"]


DecisionHook = Callable[[str, str, Decision], None]


def _base_settings(settings: suite.SuiteSettings) -> dict[str, Any]:
    """The settings that make a plan the same plan (everything but the limit)."""
    d = asdict(settings)
    d.pop("limit", None)
    return json.loads(json.dumps(d, default=str))


def _write(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2, allow_nan=False))
    os.replace(tmp, path)


def _load_state(out: Path, plan: SequentialPlan, base: dict[str, Any]) -> dict[str, Any]:
    fresh = {"method": METHOD, "plan": asdict(plan), "settings": base,
             "reference": suite.REFERENCE, "finished": False, "tasks": {}}
    try:
        old = json.loads((out / FILE).read_text())
    except (OSError, ValueError):
        return fresh
    if old.get("plan") == fresh["plan"] and old.get("settings") == base:
        return old
    return fresh


def _run_dir(out: Path, task: str, cfg: PrecisionConfig) -> Path:
    return out / "runs" / task / suite.slug(cfg.label)


def _items(out: Path, task: str, cfg: PrecisionConfig) -> pd.DataFrame:
    return pd.read_parquet(_run_dir(out, task, cfg) / "items.parquet")


def paired_in_order(ref: pd.DataFrame, cand: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Correctness of the items both answered, in the order fixed before any answer: by
    position within the subtask, then by subtask (so each round's items extend the last's)."""
    keys = ["subtask", "doc_id"]
    both = ref[[*keys, "prompt_hash", "correct"]].merge(
        cand[[*keys, "prompt_hash", "correct"]], on=keys, suffixes=("_ref", "_cand"))
    bad = both["prompt_hash_ref"] != both["prompt_hash_cand"]
    if bad.any():
        raise PairingError(f"{int(bad.sum())} items were asked with different prompts than the "
                           "reference's; runs must share data, limit and seed")
    both["position"] = both.groupby("subtask")["doc_id"].rank(method="first")
    both = both.sort_values(["position", "subtask"], kind="stable")
    return (both["correct_ref"].to_numpy(dtype=bool), both["correct_cand"].to_numpy(dtype=bool))


def _looked_at(ref: pd.DataFrame, n: int) -> int:
    """Items a look at ``n`` per subtask sees (subtasks with fewer give all they have)."""
    return int(ref.groupby("subtask").size().clip(upper=n).sum())


def replay_fixed_run(out: str | Path, task: str, configs: list[str | PrecisionConfig],
                     plan: SequentialPlan) -> dict[str, Any]:
    """What ``--until-decided`` would have decided and generated on a finished fixed-n run at
    the cap (``configs[0]`` the reference). Greedy generation answers the first ``n`` items of
    a larger run exactly as a run of ``n`` items (the prefix order above), so the verdicts and
    item counts are those of the live procedure, at no generation cost."""
    out = Path(out)
    cfgs = suite._config_list(configs)
    reference, others = cfgs[0], cfgs[1:]
    ref = _items(out, task, reference)
    budget = plan.budget_points / 100.0
    looks = plan.looks()
    rows, ref_n = {}, 0
    for cfg in others:
        a, b = paired_in_order(ref, _items(out, task, cfg))
        for n in looks:
            k = min(_looked_at(ref, n), len(a))
            d = decide(a[:k], b[:k], budget, plan.alpha)
            if d.verdict != "undecided" or n == looks[-1]:
                break
        ref_n = max(ref_n, n)
        rows[cfg.label] = {"verdict": d.verdict, "n": n, "items": k, "delta": d.delta,
                           "lo": d.lo, "hi": d.hi, "fixed_n_verdict": decide(a, b, budget,
                                                                             plan.alpha).verdict}
    used = _looked_at(ref, ref_n) + sum(r["items"] for r in rows.values())
    fixed = len(ref) * (1 + len(others))
    return {"task": task, "reference": str(reference), "budget_points": plan.budget_points,
            "alpha": plan.alpha, "round": plan.round_size, "cap": plan.cap,
            "configs": rows, "reference_n": ref_n,
            "generations": {"used": used, "fixed_n": fixed,
                            "saved": 1 - used / fixed if fixed else 0.0}}


def _items_at_cap(ref: pd.DataFrame, n: int, cap: int) -> int:
    """Items a fixed-n run at the cap would have: subtasks that gave fewer than ``n`` items
    are exhausted; the others would give ``cap``."""
    counts = ref.groupby("subtask").size()
    return int(sum(c if c < n else cap for c in counts))


def _generated(rdir: Path) -> int:
    """Generations a run made itself (its log entries not answered from an earlier run)."""
    try:
        lines = (rdir / "generations.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if line.strip() and not json.loads(line).get("reused"))


def _record(d: Decision, n: int, items: int) -> dict[str, Any]:
    return {"n": n, "items": items, "verdict": d.verdict, "delta": d.delta, "lo": d.lo,
            "hi": d.hi}


def run_until_decided(settings: suite.SuiteSettings, out: str | Path, plan: SequentialPlan, *,
                      progress: suite.SuiteProgress | None = None,
                      responder: Callable[[str, dict], str | None] | None = None,
                      on_decision: DecisionHook | None = None,
                      resamples: int = 10_000) -> SequentialResult:
    """Run ``settings`` (its ``limit`` is ignored: ``plan`` sets the counts) round by round
    until every config is decided against the budget or the cap is reached; write the final
    ``summary.json`` / ``items.parquet`` and ``sequential.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    configs = suite._config_list(settings.configs)
    reference, others = configs[0], configs[1:]
    budget = plan.budget_points / 100.0
    state = _load_state(out, plan, _base_settings(settings))
    path = out / FILE
    cache: dict[str, Any] = {}
    looks = plan.looks()
    for task in settings.tasks:
        tstate = state["tasks"].setdefault(task, {"reference_n": 0, "configs": {}, "generated": {}})
        rows = tstate["configs"]
        for cfg in others:
            rows.setdefault(cfg.label, {"config": str(cfg), "verdict": "undecided", "n": 0,
                                        "history": []})
        previous_items = -1
        announced: set[str] = set()
        for n in looks:
            pending = [c for c in others if not rows[c.label].get("final")
                       and rows[c.label]["n"] < n]
            if not pending and tstate["reference_n"]:
                break
            run = replace(settings, tasks=(task,), configs=tuple(str(c) for c in pending),
                          limit=n)
            done = suite.run_suite(run, out, progress=progress, responder=responder,
                                   resamples=resamples, cache=cache, summary=False)
            for t, label in done.ran:
                rdir = out / "runs" / t / suite.slug(label)
                tstate["generated"][label] = tstate["generated"].get(label, 0) + _generated(rdir)
            tstate["reference_n"] = n
            ref_items = _items(out, task, reference)
            exhausted = len(ref_items) == previous_items or n == looks[-1]
            previous_items = len(ref_items)
            tstate["items_at_cap"] = _items_at_cap(ref_items, n, plan.cap)
            for cfg in pending:
                a, b = paired_in_order(ref_items, _items(out, task, cfg))
                d = decide(a, b, budget, plan.alpha)
                row = rows[cfg.label]
                row["history"].append(_record(d, n, len(a)))
                row |= {"n": n, "items": len(a), "delta": d.delta, "lo": d.lo, "hi": d.hi}
                if d.verdict != "undecided" or exhausted:
                    row["verdict"] = d.verdict
                    row["final"] = True
                    announced.add(cfg.label)
                    if on_decision is not None:
                        on_decision(task, cfg.label, d)
            _write(path, suite.finite_json(state))
            if exhausted:
                break
        for cfg in others:  # decided by an earlier invocation of the same plan
            row = rows[cfg.label]
            if on_decision is not None and cfg.label not in announced:
                on_decision(task, cfg.label, Decision(row["verdict"], row.get("items", 0),
                                                      _nan(row.get("delta")),
                                                      _nan(row.get("lo")), _nan(row.get("hi"))))
    state["generations"] = _generation_counts(out, state, reference, others)
    state["finished"] = True
    _write(path, suite.finite_json(state))
    final = replace(settings, limit=max((t["reference_n"] for t in state["tasks"].values()),
                                        default=plan.round_size))
    _, summary = suite.write_summary(out, final, resamples=resamples)
    return SequentialResult(out, state, summary)


def _generation_counts(out: Path, state: dict[str, Any], reference: PrecisionConfig,
                       others: list[PrecisionConfig]) -> dict[str, Any]:
    """Generations the plan needed (every item of every final run, each generated once)
    against a fixed-n run of the same configs at the cap."""
    used = fixed = generated = 0
    per_task = {}
    for task, t in state["tasks"].items():
        need = sum(len(_items(out, task, c)) for c in [reference, *others]
                   if (_run_dir(out, task, c) / "items.parquet").is_file())
        at_cap = int(t.get("items_at_cap", 0)) * (1 + len(others))
        made = sum(t.get("generated", {}).values())
        per_task[task] = {"used": need, "fixed_n": at_cap, "generated_by_this_plan": made}
        used, fixed, generated = used + need, fixed + at_cap, generated + made
    saved = 1 - used / fixed if fixed else 0.0
    return {"used": used, "fixed_n": fixed, "saved": saved, "generated_by_this_plan": generated,
            "per_task": per_task}


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


