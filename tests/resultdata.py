"""Result folders for the recommender, report and gate tests, in the exact schema the drift and
eval commands write (see replayssm_quant/results/model.py), with chosen numbers."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path

from replayssm_quant.precision import PRESETS, SHAPES, parse_config, step_bytes

NANO = SHAPES["nemotron-3-nano-4b"]
BUCKETS = [(128, 256), (256, 512), (512, 1024), (1024, 2047)]
POSITIONS = 2 * (2047 - 128)  # two documents of 2048 tokens


def _stats(kl: float, top1: float, n: int, ppl_ratio: float | None = None) -> dict:
    nan = kl is None or (isinstance(kl, float) and math.isnan(kl))
    k = None if nan else kl
    return {
        "n": n, "kl_mean": k, "kl_se": None if nan else kl / 10,
        "kl_ci_lo": None if nan else kl * 0.8, "kl_ci_hi": None if nan else kl * 1.2,
        "kl_median": None if nan else kl / 2, "kl_p90": None if nan else kl * 2,
        "kl_p95": None if nan else kl * 3, "kl_p99": None if nan else kl * 5,
        "kl_p99_9": None if nan else kl * 8, "kl_max": None if nan else kl * 10,
        "same_top1": top1, "same_top1_lo": max(0.0, top1 - 0.005),
        "same_top1_hi": min(1.0, top1 + 0.002), "dp_mean": -1e-5, "dp_rms": 1e-3,
        "ppl_ref": 20.0, "ppl": 20.0 * (ppl_ratio or 1 + (k or 0)),
        "ppl_ratio": ppl_ratio or 1 + (k or 0), "ppl_ratio_lo": 1.0,
        "ppl_ratio_hi": (ppl_ratio or 1 + (k or 0)) * 1.01,
    }


def drift_summary(kl_last: Mapping[str, float], top1_last: Mapping[str, float] | None = None,
                  *, model: str = "nvidia/NVIDIA-Nemotron-3-Nano-4B", shape=NANO,
                  buckets=BUCKETS, seed: int = 0, data: str = "pg19", prefill: int = 128
                  ) -> dict:
    """A drift summary whose KL grows 2x per bucket up to ``kl_last`` in the last bucket."""
    top1_last = top1_last or {}
    per_bucket_n = [(hi - lo) * 2 for lo, hi in buckets]
    configs = []
    for name, kl in kl_last.items():
        cfg = parse_config(name)
        top1 = top1_last.get(name, 1.0 - min(kl, 0.1) / 5)
        blocks = []
        for i, (lo, hi) in enumerate(buckets):
            scale = 2.0 ** (i - len(buckets) + 1)
            k = kl * scale if kl is not None and not math.isnan(kl) else kl
            blocks.append({"bucket": f"[{lo},{hi})", "lo": lo, "hi": hi}
                          | _stats(k, top1 if i == len(buckets) - 1 else min(1.0, top1 + 0.005),
                                   per_bucket_n[i]))
        configs.append({"name": cfg.label, "config": str(cfg),
                        "overall": _stats(kl / 2 if kl is not None and not math.isnan(kl) else kl,
                                          min(1.0, top1 + 0.003), sum(per_bucket_n)),
                        "buckets": blocks})
    return {
        "model": model, "model_type": "nemotron_h",
        "ssm_shape": {"kind": shape.kind, "heads": shape.heads, "head_dim": shape.head_dim,
                      "d_state": shape.d_state, "groups": shape.groups, "layers": 21},
        "data": data,
        "documents": [{"doc_id": f"pg19/{i}", "name": f"book{i}", "tokens": 2048,
                       "source": "pg19"} for i in range(2)],
        "max_tokens": 2048, "prefill": prefill, "seed": seed, "reference": "exact",
        "tokens": 4096, "positions_per_config": sum(per_bucket_n),
        "buckets": [{"bucket": f"[{lo},{hi})", "lo": lo, "hi": hi} for lo, hi in buckets],
        "configs": configs,
        "decay_spectrum": {
            "layers": [{"layer": layer, "kind": "mamba2", "tokens": 4096,
                        "mean_decay": [0.9 + 0.0099 * h for h in range(10)],
                        "geomean_decay": [0.9 + 0.0099 * h for h in range(10)],
                        "memory_tokens": [1 / (1 - (0.9 + 0.0099 * h)) for h in range(10)],
                        "max_mean_decay": 0.9891} for layer in (0, 2, 4)],
            "heads": 30, "fraction_of_heads": {">=0.99": 0.0, ">=0.999": 0.0},
            "max_mean_decay": 0.9891},
        "device": "cpu", "dtype": "float32",
        "versions": {"replayssm_quant": "0.1.0", "torch": "2.13.0"},
    }


def write_drift(folder: Path, kl_last: Mapping[str, float], **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(drift_summary(kl_last, **kw), indent=1))
    return folder


def task_summary(rows: Mapping[tuple[str, str], tuple[float, float]], *,
                 model: str = "nvidia/NVIDIA-Nemotron-3-Nano-4B", items: int = 198,
                 n: Mapping[tuple[str, str], int] | None = None,
                 truncation: float = 0.01, invalid: float = 0.005,
                 method: str | None = "tango-score") -> dict:
    """Task results: ``rows[(task, config)] = (accuracy, delta_lo)`` (fractions); the fp32
    reference row is added per task with accuracy 0.70. ``method``: the rows'
    ``delta_ci_method`` (None: left out, as runs before it was recorded)."""
    extra = {} if method is None else {"delta_ci_method": method}
    n = n or {}
    tasks = sorted({t for t, _ in rows})
    out = []
    for task in tasks:
        out.append({"task": task, "name": "fp32", "config": str(PRESETS["fp32"]), "n": items,
                    "accuracy": 0.70, "accuracy_lo": 0.63, "accuracy_hi": 0.76,
                    "delta": 0.0, "delta_lo": 0.0, "delta_hi": 0.0, "mcnemar_p": 1.0,
                    "flip_rate": 0.0, "truncation_rate": truncation, "invalid_rate": 0.0}
                   | extra)
        for (t, name), (acc, dlo) in rows.items():
            if t != task:
                continue
            cfg = parse_config(name)
            delta = acc - 0.70
            out.append({"task": task, "name": cfg.label, "config": str(cfg),
                        "n": n.get((t, name), items), "accuracy": acc,
                        "accuracy_lo": acc - 0.065, "accuracy_hi": acc + 0.06,
                        "delta": delta, "delta_lo": dlo, "delta_hi": delta + (delta - dlo),
                        "mcnemar_p": 0.5, "flip_rate": 0.04, "truncation_rate": truncation,
                        "invalid_rate": invalid} | extra)
    return {"kind": "tasks", "schema_version": 1, "model": model, "reference": "fp32",
            "seed": 1234, "tasks": [{"task": t, "items": items, "max_gen_toks": 32768}
                                    for t in tasks],
            "results": out}


def write_tasks(folder: Path, rows, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(task_summary(rows, **kw), indent=1))
    return folder


def write_bench(path: Path, times: Mapping[str, float], *, shape: str = "nemotron-3-nano-4b",
                batch: int = 256, extra_batches: tuple[int, ...] = (1,)) -> Path:
    """A decode.csv in benchmarks/decode.py's columns (sorted, as it writes them)."""
    sh = SHAPES[shape]
    rows = []
    for b in (batch, *extra_batches):
        base = times.get("fp32")
        for name, us in times.items():
            cfg = parse_config(name)
            sb = step_bytes(cfg, sh)
            t = us if b == batch else us / 10
            rows.append({"shape": shape, "kind": sh.kind, "batch": b, "config": cfg.label,
                         "config_string": str(cfg), "L": cfg.L, "window_us": t,
                         "nonflush_us": t * 0.9, "flush_us": t * 2,
                         "bytes_per_step": sb.window_average * b,
                         "nonflush_bytes": sb.nonflush * b, "flush_bytes": sb.flush * b,
                         "bw_frac_window": 0.5, "bw_frac_nonflush": 0.5, "bw_frac_flush": 0.5,
                         "speedup_vs_conv_fp32": (base / us) if base else float("nan")})
        rows.append({"shape": shape, "kind": sh.kind, "batch": b,
                     "config": "fla-fused-recurrent",
                     "config_string": "FLA fused_recurrent_gated_delta_rule fp32 state", "L": 1,
                     "window_us": 99.0, "nonflush_us": 99.0, "flush_us": 99.0,
                     "bytes_per_step": 1.0, "bw_frac_window": 0.5,
                     "speedup_vs_conv_fp32": 1.0})
    keys = sorted({k for r in rows for k in r})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return path


def paired_tasks(folder: Path, configs: Mapping[str, int], *, n: int, task: str = "gpqa",
                 truncation: float = 0.0, invalid: float = 0.0,
                 method: str | None = "tango-score", **kw) -> Path:
    """Task results whose paired intervals are Tango's, computed from real paired correctness:
    ``configs[name]`` items of the reference's ``n`` (70% right) turn wrong under ``name``."""
    import numpy as np

    from replayssm_quant.evals.stats import paired_difference_ci

    ref = np.arange(n) < round(0.7 * n)
    summary = task_summary({(task, name): (0.7, 0.0) for name in configs}, items=n,
                           truncation=truncation, invalid=invalid, method=method, **kw)
    for row in summary["results"]:
        row["truncation_rate"], row["invalid_rate"] = truncation, invalid
        if row["name"] == "fp32":
            continue
        cand = ref.copy()
        cand[: configs[row["name"]]] = False
        delta, lo, hi = paired_difference_ci(ref, cand)
        row |= {"accuracy": float(cand.mean()), "delta": delta, "delta_lo": lo, "delta_hi": hi,
                "flip_rate": configs[row["name"]] / n}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return folder
