"""Summarise Nsight Compute text reports (``ncu --section ...`` output, one or more kernels
per file) as one table row per profiled kernel: duration, DRAM throughput, issue-slot use,
the busiest pipeline, registers and occupancy. Lines ``=== label: ...`` in the input name the
kernel that follows them (``reports/kernels/ncu_profiles.txt`` concatenates runs that way).

    python tools/ncu_summary.py reports/kernels/ncu_profiles.txt
    python tools/ncu_summary.py run1.txt run2.txt --json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_KERNEL = re.compile(r"^  (\w+) \([\d, ]+\)x\([\d, ]+\), Context")
_METRIC = re.compile(r"^\s+(.+?)\s{2,}(\S+)\s+([\d,.]+)\s*$")
_PIPE = re.compile(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)")
_LABEL = re.compile(r"^=== ([^:]+):")
METRICS = {"Duration": "duration", "DRAM Throughput": "dram_pct",
           "Issue Slots Busy": "issue_pct", "Registers Per Thread": "registers",
           "Achieved Occupancy": "occupancy_pct",
           "Warp Cycles Per Issued Instruction": "cycles_per_issue"}


def parse(text: str) -> list[dict]:
    """One dict per kernel block of an ncu text report."""
    rows: list[dict] = []
    label = None
    for line in text.splitlines():
        if m := _LABEL.match(line):
            label = m.group(1).strip()
        elif m := _KERNEL.match(line):
            rows.append({"label": label, "kernel": m.group(1)})
            label = None
        elif rows and (m := _PIPE.search(line)):
            rows[-1].setdefault("pipe", f"{m.group(1)} {float(m.group(2)):.0f}%")
        elif rows and (m := _METRIC.match(line)) and m.group(1).strip() in METRICS:
            key = METRICS[m.group(1).strip()]
            value = float(m.group(3).replace(",", ""))
            if key == "duration":
                value *= {"ms": 1000.0, "us": 1.0, "ns": 1e-3}.get(m.group(2), 1.0)
                key = "duration_us"
            rows[-1].setdefault(key, value)
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (``-`` / ``nan`` where a section was not collected)."""
    nan = float("nan")
    out = ["| case | kernel | us | DRAM % | issue slots % | busiest pipe | registers | "
           "occupancy % | cycles per issue |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        g = r.get
        out.append(f"| {g('label') or '-'} | {r['kernel']} | {g('duration_us', nan):.1f} | "
                   f"{g('dram_pct', nan):.0f} | {g('issue_pct', nan):.0f} | {g('pipe', '-')} | "
                   f"{g('registers', nan):.0f} | {g('occupancy_pct', nan):.0f} | "
                   f"{g('cycles_per_issue', nan):.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="ncu text reports")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    for path in args.reports:
        p = Path(path)
        if not p.is_file():
            raise SystemExit(f"no such report: {path}")
        found = parse(p.read_text(errors="replace"))
        if not found:
            print(f"warning: no profiled kernel in {path}", file=sys.stderr)
        rows += found
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
