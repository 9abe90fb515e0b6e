"""Write small offline task data in the hub schemas for `replayssm-quant eval --data DIR`.

    python tools/make_task_data.py DIR [--gpqa 8] [--mmlu 4] [--math 4]

The items exercise lm-eval's real prompts, filters and metrics offline; a model's accuracy on
them says nothing about the real GPQA-Diamond / MMLU-Pro / MATH benchmarks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from replayssm_quant.evals.offline_data import write_task_data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--gpqa", type=int, default=8, help="GPQA items")
    ap.add_argument("--mmlu", type=int, default=4, help="MMLU-Pro test items per category")
    ap.add_argument("--math", type=int, default=4, help="MATH Level 5 items per subject")
    a = ap.parse_args()
    root = write_task_data(a.out, gpqa=a.gpqa, mmlu_test=a.mmlu, mmlu_val=5, math=a.math)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
