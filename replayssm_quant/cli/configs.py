"""``replayssm-quant configs``: the presets with their state traffic per decode step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..precision import (
    PRESETS,
    SHAPES,
    WINDOW_LENGTHS,
    ModelShape,
    PrecisionConfig,
    parse_config,
    resolve_shape,
    step_bytes,
)
from .console import print_table

HOW_TO_READ = ("How to read it: bytes of SSM state one decode step reads and writes; fewer is "
               "cheaper, and 'vs conventional FP32' below 1 is the saving over the fp32 preset.")
WINDOWS_HOW_TO_READ = ("How to read it: a step of a window of L reads the read copy (or "
                       "checkpoint) and the ring's records so far; the flush writes the "
                       "checkpoint and read copy once per window. 'fewest bytes' is the L of "
                       "these with the smallest window average, 'optimum' the real-valued "
                       "minimum; 'fastest B=n' the L measured fastest at batch n.")
PAGE_HOW_TO_READ = ("How to read it: the cache bytes one request holds per layer; 'vs stock "
                    "FP32' below 1 fits that many more requests in the same memory.")


def configs_table(shape: ModelShape, extra: list[PrecisionConfig] | None = None) -> list[dict]:
    """One row per preset (plus ``extra`` configs) for ``shape``."""
    base = step_bytes(PRESETS["fp32"], shape).window_average
    cfgs = list(PRESETS.values()) + list(extra or [])
    rows = []
    for cfg in cfgs:
        b = step_bytes(cfg, shape)
        rows.append({
            "name": cfg.label, "config": str(cfg), "shape": shape.name,
            "bytes_per_step": b.window_average, "nonflush_bytes": b.nonflush,
            "flush_bytes": b.flush, "state_bytes_per_seq": b.state_bytes,
            "traffic_vs_fp32": b.window_average / base,
        })
    return rows


def _fmt_bytes(b: float) -> str:
    for unit, div in (("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            return f"{b / div:,.2f} {unit}"
    return f"{b:,.0f} B"


def register(app: typer.Typer) -> None:
    @app.command("configs")
    def configs(
        shape: Annotated[str, typer.Option(
            help=f"Layer shape for the byte counts: {', '.join(SHAPES)}")] = "nemotron-3-super",
        config: Annotated[list[str] | None, typer.Option(
            "--config", "-c", help="Extra config strings to list, e.g. 'ckpt=fp16:sr,read=fp8,L=8'")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
        vllm_page: Annotated[bool, typer.Option(
            "--vllm-page", help="Bytes per request in vLLM's cache per preset (the plugin's page "
            "layout: conv state, checkpoint, read copy, ring), for one layer.")] = False,
        tp: Annotated[int, typer.Option(help="Tensor-parallel size for --vllm-page.")] = 1,
        windows: Annotated[bool, typer.Option(
            "--windows", help="Per windowed preset, the window-average bytes per step at each "
            "window length (--L): ring reads grow with L, the flush's writes spread over L; "
            "the L with the fewest bytes, and with --bench-table the fastest L measured at "
            "each batch.")] = False,
        lengths: Annotated[list[int] | None, typer.Option(
            "--L", help="Window lengths for --windows (repeat the option); default 8 16 32 64.")
        ] = None,
        bench_table: Annotated[Path | None, typer.Option(
            "--bench-table", help="Benchmark table of a sweep over L (benchmarks/decode.py "
            "--L 8 16 32 64: window_l.json or decode.json / .csv); implies --windows.")] = None,
    ) -> None:
        """List the precision presets with their state bytes per decode step (one layer, one
        sequence) and traffic relative to conventional FP32 decoding; with --windows, how the
        bytes change with the window length L and which L is cheapest, modelled and measured."""
        if vllm_page:
            _print_vllm_page(shape, config, tp, as_json)
            return
        if windows or lengths or bench_table is not None:
            _print_windows(shape, lengths, bench_table, as_json)
            return
        try:
            layer_shape = resolve_shape(shape)
            rows = configs_table(layer_shape, [parse_config(c) for c in config or []])
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        t = Table(title=f"State traffic per decode step, one layer of {rows[0]['shape']}")
        for col in ("preset", "config", "bytes/step (window avg)", "non-flush", "flush",
                    "vs conventional FP32"):
            t.add_column(col, justify="left" if col in ("preset", "config") else "right",
                         no_wrap=True)
        for r in rows:
            t.add_row(r["name"], r["config"], _fmt_bytes(r["bytes_per_step"]),
                      _fmt_bytes(r["nonflush_bytes"]), _fmt_bytes(r["flush_bytes"]),
                      f"{r['traffic_vs_fp32']:.3f}")
        print_table(Console(), t, HOW_TO_READ)


def _print_windows(shape: str, lengths: list[int] | None, bench_table: Path | None,
                   as_json: bool) -> None:
    from ..recommend import window_length_table
    from ..results import InputError, load_benchmark

    try:
        layer_shape = resolve_shape(shape)
        bench = load_benchmark(bench_table) if bench_table is not None else None
        rows = window_length_table(layer_shape, tuple(lengths or WINDOW_LENGTHS), bench)
    except (ValueError, InputError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    Ls = sorted(rows[0]["bytes_per_step"])
    batches = sorted({b for r in rows for b in r.get("measured", {})})
    t = Table(title=f"Window-average state bytes per decode step by window length L, one layer "
                    f"of {layer_shape.name}" + (f"; fastest L measured in {bench_table}"
                                                if bench_table is not None else ""))
    for col in ("preset", *(f"L={L}" for L in Ls), "fewest bytes", "optimum",
                *(f"fastest B={b}" for b in batches)):
        t.add_column(col, justify="left" if col == "preset" else "right", no_wrap=True)
    for r in rows:
        meas = [_measured_cell(r["measured"].get(b)) for b in batches]
        t.add_row(r["name"], *(_fmt_bytes(r["bytes_per_step"][L]) for L in Ls),
                  str(r["bytes_best_L"]), f"{r['bytes_optimum_L']:.1f}", *meas)
    print_table(Console(), t, WINDOWS_HOW_TO_READ)


def _measured_cell(m: dict | None) -> str:
    if not m or m["best_L"] is None:
        return "-"
    return str(m["best_L"]) + (" (only L timed)" if len(m["window_us"]) == 1 else "")


def _print_vllm_page(shape: str, config: list[str] | None, tp: int, as_json: bool) -> None:
    from ..vllm_plugin.layout import vllm_page_table

    try:
        layer_shape = resolve_shape(shape)
        rows = vllm_page_table(layer_shape, [parse_config(c) for c in config or []], tp=tp)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(rows))
        return
    t = Table(title=f"vLLM cache bytes per request and layer, {rows[0]['shape']}, TP={tp}")
    for col in ("preset", "config", "page", "checkpoint", "read copy", "ring", "vs stock FP32"):
        t.add_column(col, justify="left" if col in ("preset", "config") else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["name"], r["config"], _fmt_bytes(r["page_bytes"]), _fmt_bytes(r["ckpt_bytes"]),
                  _fmt_bytes(r["read_bytes"]), _fmt_bytes(r["ring_bytes"]),
                  f"{r['vs_stock_fp32']:.3f}")
    print_table(Console(), t, PAGE_HOW_TO_READ)
