"""tools/regcap_scan.py: the register caps at each step of programs per SM, and one program
scanned for sm_90 on this CPU machine (Triton's bundled ptxas, without the interpreter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "regcap_scan.py"


def _module():
    spec = importlib.util.spec_from_file_location("regcap_scan", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cap_steps_are_the_per_scheduler_steps():
    steps = _module().cap_steps
    assert steps(96, 1) == [80, 72, 64]  # 24, 28, 32 per SM (32 is the SM's program limit)
    assert steps(255, 1) == [168, 128, 96, 80, 72, 64]
    assert steps(225, 1)[:2] == [168, 128]
    assert steps(120, 8) == [80, 64, 48, 40, 32]  # 3, 4, 5, 6, 8 eight-warp programs
    assert steps(72, 1) == [64]
    assert steps(64, 1) == []


def test_program_targets_follow_the_plans():
    m = _module()
    t = m.program_target("nemotron-3-nano-4b", "shared-nvfp4", 256, "nonflush")
    assert t["target"] == "mamba2-nonflush" and t["block"] == 64 and t["warps"] == 1
    assert t["consts"]["P"] == 80 and t["consts"]["BP2"] == 16 and t["plan_cap"] == 80
    f = m.program_target("qwen3.5-122b-a10b", "nvfp4-read/fp16-sr", 256, "flush")
    assert f["target"] == "gdn-flush" and (f["block"], f["warps"]) == (16, 4)
    assert f["consts"]["HV"] == 64 and f["kw"]["fold"] == "records" and f["plan_cap"] == 64


def test_scans_one_program_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, str(TOOL), "--shapes", "qwen3.5-4b", "--presets", "fp8-read/fp32",
         "--programs", "nonflush", "--max-spills", "0", "--json"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = json.loads(out.stdout)
    assert row["target"] == "gdn-nonflush" and row["plan_cap"] == 80
    u = row["uncapped"]
    assert u["registers"] > 80 and u["instructions"] > 500
    assert row["caps"] and row["caps"][0]["cap"] == 80
    for c in row["caps"]:
        assert c["registers"] <= c["cap"] and c["programs_per_sm"] > u["programs_per_sm"]
    # a scan stops at the first cap past --max-spills
    assert all(c["spills"] == 0 for c in row["caps"][:-1])


def test_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, str(TOOL), "--shapes", "qwen3.5-4b"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and "unset TRITON_INTERPRET" in out.stderr
