"""Loader of kernel benchmark CSVs (``benchmarks/decode.py``): the measured step time per
(shape, batch, config) that the recommender can rank configs by."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..precision import PrecisionConfig, parse_config
from .errors import InputError
from .model import config_key

__all__ = ["Benchmark", "BenchmarkRow", "load_benchmark"]


@dataclass(frozen=True)
class BenchmarkRow:
    shape: str
    batch: int
    name: str
    config: PrecisionConfig | None  # None for a peer kernel that is not a config
    window_us: float
    nonflush_us: float | None
    flush_us: float | None
    speedup_vs_conv_fp32: float | None
    bw_frac_window: float | None


@dataclass(frozen=True)
class Benchmark:
    """A kernel benchmark CSV (``benchmarks/decode.py``): time per decode step per
    (shape, batch, config)."""

    path: Path
    rows: tuple[BenchmarkRow, ...]

    @property
    def shapes(self) -> list[str]:
        return list(dict.fromkeys(r.shape for r in self.rows))

    def batches(self, shape: str) -> list[int]:
        return sorted({r.batch for r in self.rows if r.shape == shape})

    def lookup(self, shape: str, batch: int, config: str | PrecisionConfig) -> BenchmarkRow | None:
        ck = config_key(config)
        for r in self.rows:
            if r.shape == shape and r.batch == batch and r.config == ck:
                return r
        return None

    def peers(self, shape: str, batch: int) -> list[BenchmarkRow]:
        return [r for r in self.rows if r.shape == shape and r.batch == batch and r.config is None]


_BENCH_REQUIRED = ("shape", "batch", "config_string", "window_us")


def load_benchmark(path: str | Path) -> Benchmark:
    """Read and validate a ``decode.csv``; rows whose ``config_string`` is not a precision
    config (peer kernels such as FLA's) are kept as peers."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"{p}: cannot read the benchmark: {e.strerror or e}") from None
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    missing = [c for c in _BENCH_REQUIRED if c not in cols]
    if missing:
        raise InputError(f"{p}: benchmark CSV lacks column(s) {', '.join(missing)} "
                         f"(has {', '.join(cols) or 'none'})")
    rows: list[BenchmarkRow] = []
    problems: list[str] = []
    seen: set[tuple[str, int, str]] = set()

    def opt(row: dict, key: str) -> float | None:
        v = (row.get(key) or "").strip()
        try:
            return float(v) if v else None
        except ValueError:
            problems.append(f"{p}: line {reader.line_num}: {key} {v!r} is not a number")
            return None

    for row in reader:
        try:
            batch = int(row["batch"])
            window = float(row["window_us"])
        except (TypeError, ValueError):
            problems.append(f"{p}: line {reader.line_num}: batch/window_us are not numbers")
            continue
        try:
            ck: PrecisionConfig | None = parse_config(row["config_string"])
        except ValueError:
            ck = None
        name = (row.get("config") or row["config_string"]).strip()
        key = (row["shape"], batch, str(ck) if ck is not None else name)
        if key in seen:
            problems.append(f"{p}: line {reader.line_num}: ({row['shape']}, batch {batch}, "
                            f"{ck or name}) measured twice")
            continue
        seen.add(key)
        rows.append(BenchmarkRow(row["shape"], batch, name, ck, window, opt(row, "nonflush_us"),
                                 opt(row, "flush_us"), opt(row, "speedup_vs_conv_fp32"),
                                 opt(row, "bw_frac_window")))
    if problems:
        raise InputError("\n".join(problems))
    if not rows:
        raise InputError(f"{p}: the benchmark CSV has no rows")
    return Benchmark(p, tuple(rows))
