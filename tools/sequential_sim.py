"""Error rates of ``eval --until-decided`` by simulation: does the betting confidence sequence
keep its verdicts' error rate at or below alpha when looked at after every round?

For each cell of a grid (drop budget, true paired difference, discordant share) it draws paired
items (:func:`replayssm_quant.evals.sequential.simulate_error_rate`), looks after every round
of 20 items up to the cap, stops at the first decisive look, and counts verdicts. A verdict is
an error when it contradicts the truth: any verdict at the budget's edge (true difference =
-budget: both exclude the truth), "pass" at a clear loss, "fail" at no difference. Writes a
Markdown table.

    python tools/sequential_sim.py reports/eval-fixtures/sequential_sim.md
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from replayssm_quant.evals.sequential import simulate_error_rate

ALPHA = 0.05
ROUND = 20
CAP = 400
TRIALS = 150
REF_ACC = 0.6

# (budget, [(label, true difference, the verdict that would be an error)], discordances)
GRID = [
    (0.02, [("edge", -0.02, "pass+fail"), ("none", 0.0, "fail"), ("clear loss", -0.06, "pass")],
     (0.06, 0.15)),
    (0.05, [("edge", -0.05, "pass+fail"), ("none", 0.0, "fail"), ("clear loss", -0.15, "pass")],
     (0.15, 0.30)),
]


def simulate(trials: int = TRIALS, seed: int = 0) -> list[dict[str, float | str]]:
    """One row per grid cell: verdict rates, the error rate and items used."""
    rows = []
    for budget, truths, discordances in GRID:
        for disc in discordances:
            for label, delta, wrong in truths:
                r = simulate_error_rate(delta, budget, ref_acc=REF_ACC, discordance=disc,
                                        n_max=CAP, round_size=ROUND, alpha=ALPHA, trials=trials,
                                        seed=seed)
                err = sum(r[w] for w in wrong.split("+"))
                rows.append({"budget": budget, "truth": label, "delta": delta,
                             "discordance": disc, "pass": r["pass"], "fail": r["fail"],
                             "undecided": r["undecided"], "error": err, "wrong": wrong,
                             "error_se": math.sqrt(err * (1 - err) / trials),
                             "mean_items": r["mean_items"]})
    return rows


def markdown(rows: list[dict[str, float | str]], trials: int, seconds: float) -> str:
    head = [
        "# Sequential decisions: error rates by simulation",
        "",
        "Command: `python tools/sequential_sim.py reports/eval-fixtures/sequential_sim.md`",
        "",
        f"Betting confidence sequence (Waudby-Smith & Ramdas 2024) of the paired difference "
        f"cand - ref, looked at after every {ROUND} items up to a cap of {CAP}, alpha = "
        f"{ALPHA}; reference accuracy {REF_ACC:.0%}; {trials} trials per row (seed 0), "
        f"{seconds:.0f} s on the CPU. An error is the verdict that contradicts the truth: "
        "either verdict at the budget's edge (both exclude the true difference), *pass* at a "
        "clear loss, *fail* at no difference. "
        "\"± se\" is the Monte-Carlo standard error of the error rate.",
        "",
        "| budget (pts) | truth | true Δ (pts) | discordant | pass | fail | undecided | "
        "error (± se) | ≤ alpha | mean items / cap |",
        "|---:|:--|---:|---:|---:|---:|---:|---:|:-:|---:|",
    ]
    body = []
    for r in rows:
        ok = "yes" if r["error"] <= ALPHA + 2 * r["error_se"] else "**no**"
        body.append(
            f"| {100 * r['budget']:g} | {r['truth']} | {100 * r['delta']:+g} | "
            f"{r['discordance']:.0%} | {r['pass']:.3f} | {r['fail']:.3f} | "
            f"{r['undecided']:.3f} | {r['error']:.3f} ± {r['error_se']:.3f} ({r['wrong']}) | "
            f"{ok} | {r['mean_items']:.0f} / {CAP} |")
    tail = [
        "",
        "Reading it: the error column must stay at or below alpha in every row (\"≤ alpha\" "
        "allows two Monte-Carlo standard errors). Mean items below the cap are the saving "
        "against a fixed-n run; at the budget's edge no procedure can decide, so those rows "
        "run to the cap and end undecided.",
        "",
    ]
    return "\n".join(head + body + tail)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    t0 = time.time()
    rows = simulate()
    text = markdown(rows, TRIALS, time.time() - t0)
    if argv:
        Path(argv[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(argv[0]).write_text(text)
        print(f"wrote {argv[0]}")
    else:
        print(text)


if __name__ == "__main__":
    main()
