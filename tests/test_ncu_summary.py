"""tools/ncu_summary.py: Nsight Compute text reports -> one row per profiled kernel."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "ncu_summary.py"

REPORT = """==PROF== Connected to process 586 (/usr/bin/python3.12)
=== Super flush: nemotron-3-super-120b nvfp4-read/fp16-sr flush
  _mamba2_flush_kernel (1056, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    DRAM Throughput                   %        18.75
    Duration                         ms         1.44
    Section: Compute Workload Analysis
    Issue Slots Busy               %        68.13
    INF   ALU is the highest-utilized pipeline (54.5%) based on elapsed cycles in the workload
    Warp Cycles Per Issued Instruction             cycle         4.78
    Registers Per Thread             register/thread             101
    Achieved Occupancy                        %        20.57
  _mamba2_nonflush_kernel (256, 128, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us        75.07
    Elapsed Cycles                cycle      146,594
"""


def _module():
    spec = importlib.util.spec_from_file_location("ncu_summary", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_reads_each_kernel_block():
    rows = _module().parse(REPORT)
    assert [r["kernel"] for r in rows] == ["_mamba2_flush_kernel", "_mamba2_nonflush_kernel"]
    a, b = rows
    assert a["label"] == "Super flush" and b["label"] is None
    assert a["duration_us"] == 1440.0 and b["duration_us"] == 75.07
    assert (a["dram_pct"], a["issue_pct"], a["registers"]) == (18.75, 68.13, 101.0)
    assert a["pipe"] == "ALU 54%" and a["cycles_per_issue"] == 4.78
    assert "issue_pct" not in b and "pipe" not in b


def test_cli_prints_a_table_and_refuses_missing_files(tmp_path):
    f = tmp_path / "ncu.txt"
    f.write_text(REPORT)
    out = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True,
                         check=True).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 4 and "| Super flush | _mamba2_flush_kernel | 1440.0 | 19 | 68 | ALU 54% |" \
        in lines[2]
    bad = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "none.txt")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "no such report" in bad.stderr
