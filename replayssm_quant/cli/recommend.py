"""``replayssm-quant recommend``: the cheapest precision config inside an accuracy budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..precision import SHAPES

BUDGET_HELP = "Budget file (YAML); flags given on the command line override its values."


def budget_from_options(budget_file: Path | None, *, max_kl: float | None = None,
                        kl_stat: str | None = None, bucket: str | None = None,
                        min_same_top1: float | None = None,
                        max_accuracy_drop: float | None = None,
                        max_ppl_ratio: float | None = None,
                        require_tasks: bool | None = None,
                        max_truncation_rate: float | None = None,
                        max_invalid_rate: float | None = None):
    """The defaults, then the budget file, then the flags that were given."""
    from ..results import Budget

    b = Budget.from_yaml(budget_file) if budget_file is not None else Budget()
    flags = {"max_kl": max_kl, "kl_stat": kl_stat, "bucket": bucket,
             "min_same_top1": min_same_top1, "max_accuracy_drop": max_accuracy_drop,
             "max_ppl_ratio": max_ppl_ratio, "require_tasks": require_tasks,
             "max_truncation_rate": max_truncation_rate, "max_invalid_rate": max_invalid_rate}
    return Budget.from_mapping({k: v for k, v in flags.items() if v is not None}, b)


def load_inputs(paths: list[Path], bench: Path | None):
    """Results and the optional benchmark; raises the loaders' errors."""
    from ..results import load_benchmark, load_results

    return load_results(paths), (load_benchmark(bench) if bench is not None else None)


def bad_input(message: str) -> typer.Exit:
    """One ``error:`` line on stderr (several problems joined with '; '), exit 2."""
    from .errors import fail

    return fail(message)


def register(app: typer.Typer) -> None:
    @app.command("recommend")
    def recommend_cmd(
        results: Annotated[list[Path], typer.Argument(
            metavar="RESULTS...",
            help="Result folders (or summary.json files) of `drift` and `eval` for the model.")],
        model: Annotated[str | None, typer.Option(
            help="The model to recommend for, when the results hold several.")] = None,
        bench: Annotated[Path | None, typer.Option(
            "--bench", "--bench-table",
            help="Kernel benchmark table (benchmarks/decode.py's decode.csv / decode.json, or "
                 "window_l.json / .csv of a sweep over L): rank by measured step time, and "
                 "choose each split's window length: the fastest L measured whose own "
                 "accuracy results pass.")
        ] = None,
        batch: Annotated[int | None, typer.Option(
            help="Benchmark batch size to rank by (default: the largest measured).")] = None,
        shape: Annotated[str | None, typer.Option(
            help=f"SSM layer shape for the byte counts and the benchmark rows ({', '.join(SHAPES)}"
                 "); default: the shape the results record.")] = None,
        cost: Annotated[str, typer.Option(
            help="Rank by: auto (time with --bench, else bytes), bytes (state traffic per "
                 "step), time, memory (state held per sequence).")] = "auto",
        budget: Annotated[Path | None, typer.Option(help=BUDGET_HELP)] = None,
        max_kl: Annotated[float | None, typer.Option(
            help="Upper limit of the KL statistic in the budget's bucket (default 0.01).")
        ] = None,
        kl_stat: Annotated[str | None, typer.Option(
            help="KL statistic the limit applies to: kl_mean, kl_ci_hi, kl_p99, ... "
                 "(default kl_mean).")] = None,
        bucket: Annotated[str | None, typer.Option(
            help="Position bucket of the drift limits: last, all or a label like "
                 "'[1024,2047)' (default last).")] = None,
        min_same_top1: Annotated[float | None, typer.Option(
            help="Lower limit of top-1 agreement, a fraction (default 0.99).")] = None,
        max_acc_drop: Annotated[float | None, typer.Option(
            help="Upper limit, in points, of the upper 95% bound of each task's paired "
                 "accuracy drop (default 1.0).")] = None,
        max_truncated: Annotated[float | None, typer.Option(
            "--max-truncated",
            help="Largest share of truncated answers (a fraction) for a task check to be "
                 "decided; beyond it the config is undecided (default 0.1).")] = None,
        max_invalid: Annotated[float | None, typer.Option(
            "--max-invalid",
            help="Largest share of invalid answers (a fraction) for a task check to be "
                 "decided (default 0.1).")] = None,
        require_tasks: Annotated[bool | None, typer.Option(
            "--require-tasks/--no-require-tasks",
            help="Reject every config when there are no task results.")] = None,
        out: Annotated[Path, typer.Option(
            help="Folder for recommendation.json and recommendation.md.")
        ] = Path("replayssm-recommendation"),
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON.")] = False,
    ) -> None:
        """Pick the cheapest precision config whose drift and task accuracy stay inside the
        budget, say why each cheaper one was rejected, and write recommendation.json and
        recommendation.md. A config whose task evidence is too thin (wide paired interval, many
        truncated or invalid answers) is undecided and never picked. Exit 0 with a pick, 3 when
        no config qualifies or is decided (the closest one is named), 2 on bad input."""
        from ..recommend import recommend
        from ..report import recommendation_markdown
        from ..results import InputError, ResultsError
        from .errors import check_out_dir

        try:
            b = budget_from_options(budget, max_kl=max_kl, kl_stat=kl_stat, bucket=bucket,
                                    min_same_top1=min_same_top1,
                                    max_accuracy_drop=max_acc_drop, require_tasks=require_tasks,
                                    max_truncation_rate=max_truncated,
                                    max_invalid_rate=max_invalid)
            check_out_dir(out)
            rs, bm = load_inputs(results, bench)
            rec = recommend(rs.model(model), b, shape=shape, bench=bm, batch=batch,
                            cost_basis=cost)
        except (InputError, ResultsError) as e:
            raise bad_input(str(e)) from None
        for line in rs.warnings:
            typer.echo(f"warning: {line}", err=True)
        files = rec.write(out, recommendation_markdown(rec))
        if as_json:
            typer.echo(json.dumps(rec.to_dict(), indent=2))
        else:
            _print(Console(), rec)
            Console(stderr=True).print(f"wrote {files['json']} and {files['markdown']}")
        raise typer.Exit(rec.exit_code)


def _print(console: Console, rec) -> None:
    from ..report.render import fmt_bytes

    t = Table(title=f"{rec.model}: configs by cost ({rec.cost_basis})", title_justify="left")
    for col in ("config", "cost", "vs FP32", "verdict", "why not"):
        t.add_column(col, overflow="fold")
    for c in rec.candidates:
        cost = (f"{c.cost.value:,.1f} µs" if rec.cost_basis == "time" and c.cost.value
                else fmt_bytes(c.cost.state_bytes if rec.cost_basis == "memory"
                               else c.cost.bytes_per_step))
        verdict = ("[green]recommended" if c is rec.chosen else
                   "qualifies" if c.qualifies else "[yellow]undecided" if c.undecided
                   else "[red]rejected")
        t.add_row(escape(c.name), cost, f"{c.cost.traffic_vs_fp32:.3f}", verdict,
                  escape("; ".join(c.reasons())) if not c.qualifies else "")
    console.print(t)
    if rec.chosen is not None:
        console.print(f"recommended: [bold]{escape(rec.chosen.name)}[/bold] "
                      f"({rec.chosen.config})")
        console.print(rec.serve_command, markup=False, soft_wrap=True)
    else:
        c = rec.closest
        console.print(("[red]no config qualifies or is decided[/red]" if rec.undecided else
                       "[red]no config qualifies[/red]") +
                      escape(f"; closest: {c.name} ({c.config}): {'; '.join(c.reasons())}"
                             if c else ""), soft_wrap=True)
    for c in rec.undecided:
        console.print(f"[yellow]undecided:[/yellow] {escape(c.name)}: "
                      f"{escape('; '.join(c.reasons()))}", soft_wrap=True)
    for note in rec.not_checked:
        console.print(f"[yellow]not checked:[/yellow] {escape(note)}")
    for w in rec.windows:
        times = ", ".join(f"L={L} {t:,.1f} µs" for L, t in w.times_us.items()) or "none measured"
        console.print(f"window length of {escape(w.name)}: "
                      + (f"[bold]L={w.chosen}[/bold]" if w.chosen else "none chosen")
                      + escape(f" (measured: {times}"
                               + "".join(f"; {n}" for n in w.notes) + ")"), soft_wrap=True)
