"""``carry_chain``: a long-generation probe in MATH-L5's answer format.

Each problem gives a function ``f`` on the digits 0-9 as a table (a random cyclic permutation,
so no digit maps to itself and every digit is visited) and a start value ``x_0``, and asks for
``x_N`` with ``x_k = f(x_{k-1})``. The worked solution writes one short line per step,
``$x_{12} = f(x_{11}) = f(3) = 8$``, then boxes ``x_N`` and closes with MATH's ``Final Answer:
The final answer is $X$. I hope it is correct.`` line. Each step is a lookup of the previous
result in the table given once in the prompt, so the answer depends on state carried step by
step across the whole 1,000+ token generation: one wrong step anywhere moves the walk to another
point of the cycle and changes the answer. Every step is a small retrieval a tiny model can
learn (copy the last value, find its row in the table, copy the entry), unlike multi-digit
addition through a BPE tokenizer.

The task itself is lm-eval YAML (``lm_tasks/carry_chain.yaml``): MATH's prompt
(``Problem:\\n...\\n\\nSolution:``) and MATH-hard's own ``process_results`` (math-verify
equivalence on the boxed answer), reading the jsonl this module writes
(``problem``, ``solution``, ``answer``, ``terms``, ``table``, ``start``).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "TASK_YAML",
    "CarryChainDifficulty",
    "make_doc",
    "make_docs",
    "write_carry_chain_task",
    "write_jsonl",
]

TASK_YAML = Path(__file__).resolve().parent / "lm_tasks" / "carry_chain.yaml"
"""The project's lm-eval task definition of the probe."""

LOCAL_NAME = "carry_chain_local"
"""Name of the wrapper task that points the YAML at a generated jsonl."""


RULES: dict[str, str] = {
    "table": "f is a random cyclic permutation given as a ten-row table in the prompt; each "
             "step looks up the previous value in it (a retrieval from the prompt)",
    "shift": "f(x) = x + s modulo 10, with s in {1, 3, 7, 9} stated once in the prompt; each "
             "step adds s to the previous value (no retrieval, only the carried value and s)",
}
"""The step rules of the walk. Both are single ten-cycles, so the walk never sticks."""


@dataclass(frozen=True)
class CarryChainDifficulty:
    """How hard a problem is: ``terms`` steps of the walk (solution lines) and the step ``rule``.

    With the fixtures' tokenizer (one token per digit) a step line is ~30 tokens; the default 48
    steps give worked solutions of ~1,500 tokens. Every extra step adds one more lookup the
    answer depends on. ``shift`` needs nothing from the prompt but ``s`` and ``x_0``, so a model
    whose attention sees only the last few tokens must carry everything in its SSM state.
    """

    terms: int = 48
    rule: str = "table"

    def __post_init__(self) -> None:
        if self.terms < 2:
            raise ValueError(f"carry_chain needs at least 2 terms (steps), got {self.terms}")
        if self.rule not in RULES:
            raise ValueError(f"unknown carry_chain rule {self.rule!r}; choose from {', '.join(RULES)}")


DIGITS = 10


def random_cycle(rng: random.Random) -> list[int]:
    """``f`` as a list (``f[d]``): one cycle through all ten digits, so the walk never sticks."""
    order = list(range(DIGITS))
    rng.shuffle(order)
    table = [0] * DIGITS
    for i, d in enumerate(order):
        table[d] = order[(i + 1) % DIGITS]
    return table


SHIFTS = (1, 3, 7, 9)
"""Shifts coprime to 10: ``x + s mod 10`` visits every digit."""


def make_doc(rng: random.Random, difficulty: CarryChainDifficulty) -> dict[str, Any]:
    """One problem with its worked solution, drawn from ``rng``."""
    if difficulty.rule == "shift":
        shift = rng.choice(SHIFTS)
        table = [(d + shift) % DIGITS for d in range(DIGITS)]
        given = f"is $f(x) = x + {shift}$ modulo 10"
        how = "adding the shift modulo 10"
    else:
        table = random_cycle(rng)
        rows = ", ".join(f"f({d}) = {table[d]}" for d in range(DIGITS))
        given = f"is given by the table ${rows}$"
        how = "reading each value from the table"
    start = rng.randrange(DIGITS)
    n = difficulty.terms
    problem = (f"The function $f$ on the digits {given}. Let $x_{{0}} = "
               f"{start}$ and $x_{{k}} = f(x_{{k-1}})$ for $k \\geq 1$. Writing every step, "
               f"find $x_{{{n}}}$.")
    lines = [f"We apply $f$ one step at a time, {how}.",
             f"$x_{{0}} = {start}$"]
    x = start
    for k in range(1, n + 1):
        lines.append(f"$x_{{{k}}} = f(x_{{{k - 1}}}) = f({x}) = {table[x]}$")
        x = table[x]
    lines.append(f"So $x_{{{n}}} = \\boxed{{{x}}}$.")
    lines.append(f"Final Answer: The final answer is ${x}$. I hope it is correct.")
    return {"problem": problem, "solution": "\n".join(lines), "answer": str(x), "terms": n,
            "table": table, "start": start, "rule": difficulty.rule}


def make_docs(n: int, seed: int = 0,
              difficulty: CarryChainDifficulty | None = None) -> Iterator[dict[str, Any]]:
    """``n`` problems; the same ``(n, seed, difficulty)`` gives the same problems, and the
    first ``k`` problems do not depend on ``n``."""
    rng = random.Random(f"carry_chain:{seed}")
    difficulty = difficulty or CarryChainDifficulty()
    for _ in range(n):
        yield make_doc(rng, difficulty)


def write_jsonl(path: str | Path, n: int, seed: int = 0,
                difficulty: CarryChainDifficulty | None = None) -> Path:
    """Write ``n`` problems to ``path`` (jsonl, the schema the task YAML reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        for doc in make_docs(n, seed, difficulty):
            fh.write(json.dumps(doc) + "\n")
    os.replace(tmp, path)
    return path


def write_carry_chain_task(out_dir: str | Path, n: int, seed: int = 0,
                           difficulty: CarryChainDifficulty | None = None) -> str:
    """Generate the data and a wrapper task (``carry_chain_local``) that ``include:``s the
    project's YAML with only the data file moved; returns the task name."""
    out_dir = Path(out_dir)
    data = write_jsonl(out_dir / "data" / "carry_chain.jsonl", n, seed, difficulty)
    cfg = {"include": str(TASK_YAML), "task": LOCAL_NAME, "dataset_path": "json",
           "dataset_name": None,
           "dataset_kwargs": {"data_files": {"test": [str(data.resolve())]}}}
    path = out_dir / f"{LOCAL_NAME}.yaml"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.replace(tmp, path)
    return LOCAL_NAME


def main(argv: list[str] | None = None) -> None:
    """``python -m replayssm_quant.evals.carry_chain OUT.jsonl [-n N] [--seed S] [--terms T]``"""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("-n", type=int, default=100, help="problems")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--terms", type=int, default=CarryChainDifficulty.terms,
                    help="steps of the walk (solution lines)")
    ap.add_argument("--rule", choices=tuple(RULES), default=CarryChainDifficulty.rule,
                    help="; ".join(f"{k}: {v}" for k, v in RULES.items()))
    a = ap.parse_args(argv)
    d = CarryChainDifficulty(a.terms, a.rule)
    print(f"wrote {write_jsonl(a.out, a.n, a.seed, d)}")


if __name__ == "__main__":
    main()
