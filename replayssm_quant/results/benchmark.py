"""Loader of kernel benchmark tables (``benchmarks/decode.py``'s ``decode.csv`` / ``decode.json``
and the window-length table ``window_l.csv`` / ``window_l.json``): the measured step time per
(shape, batch, config) that the recommender can rank configs by, and the fastest measured
window length of each precision split."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..precision import PrecisionConfig, parse_config, window_family, window_name
from .errors import InputError
from .model import config_key

__all__ = ["Benchmark", "BenchmarkRow", "benchmark_from_rows", "load_benchmark"]


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

    @property
    def windowed(self) -> bool:
        """A ReplaySSM window (L > 1) of a precision config."""
        return self.config is not None and self.config.L > 1


@dataclass(frozen=True)
class Benchmark:
    """A kernel benchmark table (``benchmarks/decode.py``): time per decode step per
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

    def windows(self, shape: str, batch: int, config: str | PrecisionConfig) -> dict[int, BenchmarkRow]:
        """Every measured window length of ``config``'s precision split (its formats at any
        L > 1) at (shape, batch), by L; empty for a conventional config."""
        ck = config_key(config)
        if not isinstance(ck, PrecisionConfig) or ck.L == 1:
            return {}
        fam = window_family(ck)
        found = {r.config.L: r for r in self.rows
                 if r.shape == shape and r.batch == batch and r.windowed
                 and window_family(r.config) == fam}
        return dict(sorted(found.items()))

    def best_window(self, shape: str, batch: int,
                    config: str | PrecisionConfig) -> BenchmarkRow | None:
        """The fastest measured window length of ``config``'s split at (shape, batch) (the
        smaller L on a tie); None when none has a finite time."""
        rows = [r for r in self.windows(shape, batch, config).values() if math.isfinite(r.window_us)]
        return min(rows, key=lambda r: (r.window_us, r.config.L), default=None)

    def window_table(self) -> list[dict]:
        """One entry per (shape, batch, precision split) with a window: the time per step at
        each measured L and the fastest L, for scripts and the ``configs`` table."""
        out = []
        seen: set[tuple] = set()
        for r in self.rows:
            if not r.windowed:
                continue
            key = (r.shape, r.batch, window_family(r.config))
            if key in seen:
                continue
            seen.add(key)
            wins = self.windows(r.shape, r.batch, r.config)
            best = self.best_window(r.shape, r.batch, r.config)
            out.append({
                "shape": r.shape, "batch": r.batch, "preset": window_name(r.config),
                "family": key[2], "window_us": {L: w.window_us for L, w in wins.items()},
                "speedup_vs_conv_fp32": {L: w.speedup_vs_conv_fp32 for L, w in wins.items()},
                "bw_frac_window": {L: w.bw_frac_window for L, w in wins.items()},
                "best_L": best.config.L if best is not None else None,
                "best_us": best.window_us if best is not None else None,
            })
        return out


_BENCH_REQUIRED = ("shape", "batch", "config_string", "window_us")


def _is_step_row(row: dict) -> bool:
    """False for a speculative verify row (``verify T=8 <preset>``): it carries its preset's
    config string but times a verify, not a decode step."""
    return not (str(row.get("config") or "").startswith("verify ")
                or str(row.get("verify_vs_conv_step") or "").strip())


def benchmark_from_rows(path: str | Path, rows: Iterable[tuple[str, dict]]) -> Benchmark:
    """A validated :class:`Benchmark` from ``(where, row)`` pairs (``where`` names the row in
    error messages); rows whose ``config_string`` is not a precision config (peer kernels such
    as FLA's) are kept as peers, verify rows are left out."""
    p = Path(path)
    out: list[BenchmarkRow] = []
    problems: list[str] = []
    seen: set[tuple[str, int, str]] = set()

    def opt(where: str, row: dict, key: str) -> float | None:
        v = row.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            return None
        try:
            return float(v)
        except (TypeError, ValueError):
            problems.append(f"{p}: {where}: {key} {v!r} is not a number")
            return None

    for where, row in rows:
        missing = [c for c in _BENCH_REQUIRED if c not in row]
        if missing:
            problems.append(f"{p}: {where}: no {', '.join(missing)}")
            continue
        if not _is_step_row(row):
            continue
        try:
            batch = int(row["batch"])
            window = float(row["window_us"])
        except (TypeError, ValueError):
            problems.append(f"{p}: {where}: batch/window_us are not numbers")
            continue
        try:
            ck: PrecisionConfig | None = parse_config(str(row["config_string"]))
        except ValueError:
            ck = None
        name = str(row.get("config") or row["config_string"]).strip()
        key = (str(row["shape"]), batch, str(ck) if ck is not None else name)
        if key in seen:
            problems.append(f"{p}: {where}: ({row['shape']}, batch {batch}, {ck or name}) "
                            "measured twice")
            continue
        seen.add(key)
        out.append(BenchmarkRow(str(row["shape"]), batch, name, ck, window,
                                opt(where, row, "nonflush_us"), opt(where, row, "flush_us"),
                                opt(where, row, "speedup_vs_conv_fp32"),
                                opt(where, row, "bw_frac_window")))
    if problems:
        raise InputError("\n".join(problems))
    if not out:
        raise InputError(f"{p}: the benchmark has no rows")
    return Benchmark(p, tuple(out))


def load_benchmark(path: str | Path) -> Benchmark:
    """Read and validate a benchmark table: a CSV with one row per measurement, or a JSON
    file holding a list of such rows or an object with a ``rows`` list (``decode.json``,
    ``window_l.json``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError(f"{p}: cannot read the benchmark: {e.strerror or e}") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: not JSON: {e}") from None
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InputError(f"{p}: expected a list of rows or an object with a 'rows' list")
        return benchmark_from_rows(p, ((f"row {i}", r) for i, r in enumerate(rows)))
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    missing = [c for c in _BENCH_REQUIRED if c not in cols]
    if missing:
        raise InputError(f"{p}: benchmark CSV lacks column(s) {', '.join(missing)} "
                         f"(has {', '.join(cols) or 'none'})")
    return benchmark_from_rows(p, ((f"line {reader.line_num}", r) for r in reader))
