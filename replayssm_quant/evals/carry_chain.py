"""``carry_chain``: a long-generation probe in MATH-L5's answer format.

Each problem asks for the sum of a long list of numbers; the worked solution adds them one at a
time and writes the running total after every step, then boxes the final total and closes with
MATH's ``Final Answer: The final answer is $X$. I hope it is correct.`` line. The boxed answer
depends on every step before it, so one corrupted carry anywhere in a 1,000+ token generation
changes it: the probe measures whether a decode state keeps exact information over a long
generation, which is where a state precision shows.

The task itself is lm-eval YAML (``lm_tasks/carry_chain.yaml``): MATH's prompt
(``Problem:\\n...\\n\\nSolution:``) and MATH-hard's own ``process_results`` (math-verify
equivalence on the boxed answer), reading the jsonl this module writes
(``problem``, ``solution``, ``answer``, ``terms``, ``digits``).
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


@dataclass(frozen=True)
class CarryChainDifficulty:
    """How hard a problem is: ``terms`` numbers of ``min_digits``..``max_digits`` digits.

    The defaults give worked solutions of ~1,100-1,300 tokens with the fixtures' tokenizer
    (digits are about one token each); every extra term adds ~25 tokens and one more carry
    the answer depends on.
    """

    terms: int = 48
    min_digits: int = 3
    max_digits: int = 5

    def __post_init__(self) -> None:
        if self.terms < 2:
            raise ValueError(f"carry_chain needs at least 2 terms, got {self.terms}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"carry_chain digits must satisfy 1 <= min <= max, got "
                             f"{self.min_digits}..{self.max_digits}")


def make_doc(rng: random.Random, difficulty: CarryChainDifficulty) -> dict[str, Any]:
    """One problem with its worked solution, drawn from ``rng``."""
    numbers = []
    for _ in range(difficulty.terms):
        digits = rng.randint(difficulty.min_digits, difficulty.max_digits)
        numbers.append(rng.randint(10 ** (digits - 1), 10**digits - 1))
    problem = (f"Add the following {len(numbers)} numbers, writing the running total after each "
               f"addition: ${' + '.join(map(str, numbers))}$. What is the total?")
    lines = ["We add the numbers one at a time, keeping a running total.",
             f"Start with ${numbers[0]}$."]
    total = numbers[0]
    for x in numbers[1:]:
        lines.append(f"${total} + {x} = {total + x}$")
        total += x
    lines.append(f"The total is $\\boxed{{{total}}}$.")
    lines.append(f"Final Answer: The final answer is ${total}$. I hope it is correct.")
    return {"problem": problem, "solution": "\n".join(lines), "answer": str(total),
            "terms": difficulty.terms, "digits": [difficulty.min_digits, difficulty.max_digits]}


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
    ap.add_argument("--terms", type=int, default=CarryChainDifficulty.terms)
    ap.add_argument("--min-digits", type=int, default=CarryChainDifficulty.min_digits)
    ap.add_argument("--max-digits", type=int, default=CarryChainDifficulty.max_digits)
    a = ap.parse_args(argv)
    d = CarryChainDifficulty(a.terms, a.min_digits, a.max_digits)
    print(f"wrote {write_jsonl(a.out, a.n, a.seed, d)}")


if __name__ == "__main__":
    main()
