"""Small local task data in the hub's schemas, with planted answers a test can force.

Every item carries a tag (``[gpqa:3]``, ``[mmlu:12]``, ``[math:1]``) and its correct choice is
recognisable from the prompt alone (GPQA/MMLU-Pro: the option ``right-<id>``; MATH: ``a+b``),
so :func:`make_responder` can write the answer the task's own extraction must read, whatever
letter lm-eval's shuffling gave it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from replayssm_quant.evals.offline_data import (  # noqa: F401  (re-exported for tests)
    LETTERS,
    MATH_TYPES,
    MMLU_CATEGORIES,
    write_task_data,
)


def item_of(context: str) -> tuple[str, int]:
    """(task, item id) of the last tagged item in a prompt (few-shot examples come first)."""
    tags = re.findall(r"\[(gpqa|mmlu|math):(\d+)\]", context)
    if not tags:
        raise ValueError("no planted item tag in the prompt")
    kind, i = tags[-1]
    return kind, int(i)


def correct_answer(context: str) -> tuple[str, str]:
    """(task, the answer text the task's extraction should read) for a prompt."""
    kind, i = item_of(context)
    if kind == "gpqa":
        return kind, "(" + re.search(rf"\(([A-D])\) right-{i}\n", context).group(1) + ")"
    if kind == "mmlu":
        last = context.rsplit("Question:", 1)[1]
        return kind, re.search(rf"\n([A-J])\. right-{i}\n", last).group(1)
    a, b = map(int, re.search(rf"\[math:{i}\] Compute \$(\d+)\+(\d+)\$", context).groups())
    return kind, str(a + b)


def wrong_answer(kind: str, answer: str) -> str:
    if kind == "gpqa":
        return "(A)" if answer != "(A)" else "(B)"
    if kind == "mmlu":
        return "A" if answer != "A" else "B"
    return str(int(answer) + 1)


def say(kind: str, answer: str | None, stop: bool = True) -> str:
    """A finished response stating ``answer`` (``None``: no extractable answer), ending with
    the task's stop sequence."""
    if kind == "gpqa":
        body = "I cannot tell." if answer is None else f"Let me check. The answer is {answer}."
        return f" {body}</s>" if stop else f" {body}"
    if kind == "mmlu":
        body = "No idea." if answer is None else f"Let me check. The answer is ({answer})."
        return f" {body}\n\nQuestion:" if stop else f" {body}"
    body = "I do not know." if answer is None else f"So $\\boxed{{{answer}}}$."
    return f" {body}\n\nProblem:" if stop else f" {body}"


PLAN_FP32 = "correct"


def make_responder(plan: Callable[[str, int], str]) -> Callable[[str, dict], str]:
    """A responder whose answer per item follows ``plan(task, id)``: ``correct``, ``wrong``,
    ``invalid`` (nothing extractable) or ``truncated`` (correct answer, then text that runs past
    any ``max_gen_toks`` used in the tests without a stop sequence)."""

    def respond(context: str, gen_kwargs: dict) -> str:
        kind, ans = correct_answer(context)
        what = plan(kind, item_of(context)[1])
        if what == "correct":
            return say(kind, ans)
        if what == "wrong":
            return say(kind, wrong_answer(kind, ans))
        if what == "invalid":
            return say(kind, None)
        if what == "truncated":
            return say(kind, ans, stop=False) + " and so on" * 200
        raise ValueError(what)

    return respond
