"""``replayssm-quant report``: per-model Markdown and self-contained HTML reports."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..precision import SHAPES
from .errors import check_out_dir
from .recommend import BUDGET_HELP, bad_input, budget_from_options, load_inputs


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        results: Annotated[list[Path], typer.Argument(
            metavar="RESULTS...",
            help="Result folders (or summary.json files) of `drift` and `eval`; one report per "
                 "model found.")],
        out: Annotated[Path, typer.Option(
            help="Output folder (one subfolder per model when there are several).")
        ] = Path("replayssm-report"),
        model: Annotated[list[str] | None, typer.Option(
            help="Only these models (repeatable).")] = None,
        bench: Annotated[Path | None, typer.Option(
            help="Kernel benchmark table (decode.csv / decode.json, window_l.json): measured "
                 "step times in the cost table, and each split's window length.")] = None,
        batch: Annotated[int | None, typer.Option(
            help="Benchmark batch size (default: the largest measured).")] = None,
        shape: Annotated[str | None, typer.Option(
            help=f"SSM layer shape for the cost model ({', '.join(SHAPES)}); default: the "
                 "shape the results record.")] = None,
        cost: Annotated[str, typer.Option(
            help="Rank the recommendation by auto, bytes, time or memory.")] = "auto",
        budget: Annotated[Path | None, typer.Option(help=BUDGET_HELP)] = None,
    ) -> None:
        """Write report.html (one file, plots embedded) and report.md (+ plots/*.png) per
        model: KL vs position, per-bucket KL, task accuracy with paired deltas and truncation,
        costs, the decay spectrum and the recommendation with its reasons. Exit 2 on bad
        input."""
        from ..report import build_report
        from ..report.render import slug
        from ..results import InputError, ResultsError

        try:
            check_out_dir(out)
            b = budget_from_options(budget)
            rs, bm = load_inputs(results, bench)
            names = list(model) if model else list(rs.models)
            selected = [rs.model(n) for n in names]
        except (InputError, ResultsError) as e:
            raise bad_input(str(e)) from None
        console = Console(stderr=True)
        for line in rs.warnings:
            typer.echo(f"warning: {line}", err=True)
        for m in selected:
            folder = out if len(selected) == 1 else out / slug(m.model)
            rep = build_report(m, b, bench=bm, batch=batch, shape=shape, cost_basis=cost)
            files = rep.write(folder)
            console.print(f"{m.model}: wrote {files['html']} and {files['markdown']}")
            if rep.recommendation_error:
                console.print(f"[yellow]{m.model}: no recommendation:[/yellow] "
                              f"{rep.recommendation_error}")
