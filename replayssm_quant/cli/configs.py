"""``replayssm-quant configs``: the presets with their state traffic per decode step."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..precision import PRESETS, SHAPES, ModelShape, PrecisionConfig, parse_config, resolve_shape, step_bytes
from .console import print_table

HOW_TO_READ = ("How to read it: bytes of SSM state one decode step reads and writes; fewer is "
               "cheaper, and 'vs conventional FP32' below 1 is the saving over the fp32 preset.")
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
    ) -> None:
        """List the precision presets with their state bytes per decode step (one layer, one
        sequence) and traffic relative to conventional FP32 decoding."""
        if vllm_page:
            _print_vllm_page(shape, config, tp, as_json)
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
