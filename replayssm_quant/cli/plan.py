"""``replayssm-quant plan``: the launches one decode step makes, with every resolved knob."""

from __future__ import annotations

import ast
import json
import re
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ..precision import PRESETS, SHAPES, ModelShape, PrecisionConfig, parse_config, resolve_shape, step_bytes
from .console import print_table

DEFAULT_CONFIGS = ("fp32", "replay-fp32", "nvfp4-read/fp16-sr")
HOW_TO_READ = ("How to read it: one row per kernel launch of a decode step, in launch order; "
               "programs is the grid, tile and warps each program's share, knobs the resolved "
               "settings.")


def parse_knobs(items: list[str] | None) -> dict[str, Any]:
    """``NAME=VALUE`` pairs (VALUE a Python literal: 2, True, None, 'records') -> kwargs."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ValueError(f"--knob takes NAME=VALUE, got {item!r}")
        try:
            out[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[name.strip()] = value.strip()  # a bare word: a string knob such as records
    return out


def plan_rows(shape: ModelShape, configs: list[PrecisionConfig], batches: list[int], target: str,
              knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per (config, batch): the plan (``StepPlan.to_dict``) plus the state bytes the
    whole batch moves on a non-flush and a flush step (``precision.step_bytes``)."""
    from ..kernels.plan import step_plan

    out = []
    for cfg in configs:
        for b in batches:
            try:
                plan = step_plan(shape, cfg, b, target, **knobs)
            except TypeError as e:  # an unknown knob name
                name = re.search(r"argument '(\w+)'", str(e))
                raise ValueError(
                    f"unknown knob {name.group(1) if name else e!r} for a {shape.kind} step; "
                    f"knobs are the keyword arguments of {shape.kind}_decode_step "
                    "(docs/kernels.md)") from None
            sb = step_bytes(cfg, shape)
            out.append({"shape": shape.name, "preset": cfg.label, **plan.to_dict(),
                        "nonflush_bytes": sb.nonflush * b, "flush_bytes": sb.flush * b})
    return out


def _knob_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        shape: Annotated[str, typer.Argument(
            help=f"Layer shape: {', '.join(SHAPES)} (or a short alias).")] = "nemotron-3-super",
        config: Annotated[list[str] | None, typer.Option(
            "--config", "-c", help="Preset or config string; repeat for several "
            f"(default: {', '.join(DEFAULT_CONFIGS)}; 'all': every preset).")] = None,
        batch: Annotated[list[int] | None, typer.Option(
            "--batch", "-b", help="Batch rows; repeat for several (default: 1 and 256).")] = None,
        target: Annotated[str, typer.Option(
            help="GPU the plan is for: h200, h100, a100, interpreter, cuda (this machine's "
            "GPU) or sm_XY[:SMS].")] = "h200",
        knob: Annotated[list[str] | None, typer.Option(
            "--knob", "-k", help="A decode-step knob as NAME=VALUE, e.g. flush_warps=2, "
            "one_launch=False, flush_fold=records; repeat for several.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    ) -> None:
        """Show the launches of one decode step (kernel, grid, tile, warps, fold, products,
        stages, TMA, programmatic launch) as the decode kernels resolve them for a shape,
        config and batch. Exit 2 on bad input."""
        configs = list(config or DEFAULT_CONFIGS)
        if configs == ["all"]:
            configs = list(PRESETS)
        try:
            knobs = parse_knobs(knob)
            layer_shape = resolve_shape(shape)
            cfgs = [parse_config(c) for c in configs]
            rows = plan_rows(layer_shape, cfgs, list(batch or [1, 256]), target, knobs)
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            typer.echo(json.dumps(rows, indent=2, default=str))
            return
        console = Console()
        for r in rows:
            t = r["target"]
            where = (f"{t['name']} (sm_{t['capability'][0]}{t['capability'][1]}, {t['sms']} SMs)"
                     if t["cuda"] else t["name"])
            table = Table(title=f"{r['shape']} / {r['preset']} ({r['config']}) / batch {r['batch']}"
                          f" / {where}", title_justify="left")
            for col in ("#", "launch / kernel", "programs", "tile", "warps", "knobs"):
                table.add_column(col, no_wrap=col != "knobs", min_width=40 if col == "knobs" else None,
                                 justify="right" if col in ("#", "warps") else "left")
            for i, ln in enumerate(r["launches"], 1):
                warps = str(ln["warps"]) + (f" (maxnreg {ln['maxnreg']})" if ln["maxnreg"] else "")
                table.add_row(str(i), f"{ln['launch']}\n[dim]{ln['kernel']}[/dim]",
                              str(ln["programs"]), ln["tile"], warps, _knob_text(ln["knobs"]))
            print_table(console, table, HOW_TO_READ if r is rows[-1] else None)
            mib = 2 ** 20
            if r["capacity"]:
                console.print(f"  state bytes of the batch: non-flush step {r['nonflush_bytes'] / mib:,.1f}"
                              f" MiB, flush step {r['flush_bytes'] / mib:,.1f} MiB\n")
            else:
                console.print(f"  state bytes of the batch: {r['nonflush_bytes'] / mib:,.1f} MiB per step\n")
