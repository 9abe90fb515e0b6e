"""Small offline task data in the hub's schemas (GPQA-Diamond, MMLU-Pro, MATH), so the task
suite can run end to end without the hub.

Each item carries a tag (``[gpqa:3]``, ``[mmlu:12]``, ``[math:1]``) and its correct choice is
recognisable from the prompt alone (GPQA/MMLU-Pro: the option ``right-<id>``; MATH: ``a+b``).
Tests use that to force known answers through the real extraction and scoring. These items
exercise the pipeline; a model's accuracy on them says nothing about the real benchmarks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

LETTERS = "ABCDEFGHIJ"
MMLU_CATEGORIES = ("biology", "math")
MATH_TYPES = ("Algebra", "Number Theory")


def write_task_data(root: Path, *, gpqa: int = 4, mmlu_test: int = 3, mmlu_val: int = 5,
                    math: int = 3) -> Path:
    """Write ``gpqa/gpqa_diamond.csv``, ``mmlu_pro/{test,validation}-*.parquet`` and
    ``math/test.jsonl`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "gpqa").mkdir(exist_ok=True)
    rows = [{"Question": f"[gpqa:{i}] Which label belongs to item {i}?",
             "Correct Answer": f"right-{i}", "Incorrect Answer 1": f"wrong-a-{i}",
             "Incorrect Answer 2": f"wrong-b-{i}", "Incorrect Answer 3": f"wrong-c-{i}",
             "Record ID": f"rec{i}", "Subdomain": "Test"} for i in range(gpqa)]
    pd.DataFrame(rows).to_csv(root / "gpqa" / "gpqa_diamond.csv", index=False)
    (root / "mmlu_pro").mkdir(exist_ok=True)
    splits: dict[str, list[dict]] = {"test": [], "validation": []}
    qid = 0
    for cat in MMLU_CATEGORIES:
        for split, n in (("test", mmlu_test), ("validation", mmlu_val)):
            for _ in range(n):
                ans = (qid * 7 + 3) % 10
                splits[split].append({
                    "question_id": qid, "question": f"[mmlu:{qid}] Which option is right?",
                    "options": [f"right-{qid}" if k == ans else f"opt-{qid}-{k}"
                                for k in range(10)],
                    "answer": LETTERS[ans], "answer_index": ans,
                    "cot_content": f"A: Let's think step by step. The answer is "
                                   f"({LETTERS[ans]}).",
                    "category": cat, "src": f"ori_mmlu-{cat}"})
                qid += 1
    for split, rows in splits.items():
        pd.DataFrame(rows).to_parquet(root / "mmlu_pro" / f"{split}-00000-of-00001.parquet")
    (root / "math").mkdir(exist_ok=True)
    with open(root / "math" / "test.jsonl", "w") as fh:
        i = 0
        for typ in MATH_TYPES:
            for j in range(math + 1):
                a, b = i + 2, 3 * i + 1
                level = "Level 5" if j < math else "Level 3"  # one row the task must drop
                fh.write(json.dumps({"problem": f"[math:{i}] Compute ${a}+{b}$.",
                                     "solution": f"Adding, ${a}+{b}=\\boxed{{{a + b}}}$.",
                                     "level": level, "type": typ}) + "\n")
                i += 1
    return root
