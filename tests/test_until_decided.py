"""Cheap rounds: a run redone with a larger ``--limit`` generates only its new prompts, and
``eval --until-decided`` stops each config once its paired difference is decided.

Answers are planted through the real decode path (a responder) on the carry_chain probe, whose
answer can be read off the prompt: the reference and one config answer right (a pass), a
positive control answers wrong (a fail). Every responder call is one generation.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from replayssm_quant.evals.suite import SuiteProgress, SuiteSettings, run_suite

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "nemotron-h-tiny"
TERMS = 2
CONTROL = "shared-nvfp4"
SAME = "nvfp4-read/fp32"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def carry_answer(context: str) -> int:
    """The walk's end, computed from the problem text."""
    table = [int(v) for _, v in re.findall(r"f\((\d)\) = (\d)", context)[-10:]]
    x = int(re.findall(r"Let \$x_\{0\} = (\d)\$", context)[-1])
    steps = int(re.findall(r"find \$x_\{(\d+)\}\$", context)[-1])
    for _ in range(steps):
        x = table[x]
    return x


class Planted(SuiteProgress):
    """Tracks the running config and answers for it: right, except ``wrong`` configs."""

    def __init__(self, wrong: tuple[str, ...] = ()) -> None:
        self.config = "fp32"
        self.wrong = wrong
        self.calls: list[tuple[str, str]] = []

    def run_started(self, task, config, index, total):
        self.config = config

    def respond(self, context: str, gen_kwargs: dict) -> str:
        self.calls.append((self.config, context))
        x = carry_answer(context)
        if self.config in self.wrong:
            x = (x + 1) % 10
        return f" So $\\boxed{{{x}}}$.\n\nProblem:"


def _settings(limit: int, configs: tuple[str, ...] = ()) -> SuiteSettings:
    return SuiteSettings(model=MODEL, tasks=("carry_chain",), configs=configs, limit=limit,
                         max_gen_toks=64, carry_terms=TERMS, batch_size=8)


def test_larger_limit_generates_only_new_prompts(tmp_path):
    out = tmp_path / "ev"
    plan = Planted()
    cache: dict = {}
    run_suite(_settings(3), out, progress=plan, responder=plan.respond, resamples=100,
              cache=cache)
    first = [c for _, c in plan.calls]
    assert len(first) == 3
    plan.calls.clear()
    res = run_suite(_settings(5), out, progress=plan, responder=plan.respond, resamples=100,
                    cache=cache)
    assert len(plan.calls) == 2 and not set(c for _, c in plan.calls) & set(first)
    log = [json.loads(line) for line in
           (out / "runs" / "carry_chain" / "fp32" / "generations.jsonl").read_text().splitlines()]
    assert sorted(e["reused"] for e in log) == [False, False, True, True, True]
    assert all(e["text"].startswith(" So $\\boxed{") and len(e["key"]) == 64 for e in log)
    row = next(r for r in res.summary["results"] if r["task"] == "carry_chain")
    assert row["n"] == 5 and row["accuracy"] == 1.0
    # another seed is another run: nothing is reused
    plan.calls.clear()
    other = SuiteSettings(**{**_settings(5).__dict__, "seed": 1})
    run_suite(other, out, progress=plan, responder=plan.respond, resamples=100,
              cache=cache)
    assert len(plan.calls) == 5
