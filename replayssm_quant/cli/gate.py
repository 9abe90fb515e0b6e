"""``replayssm-quant gate``: fail CI when results break a policy's thresholds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate_cmd(
        results: Annotated[list[Path], typer.Argument(
            metavar="RESULTS...", help="Result folders (or summary.json files) to check.")],
        policy: Annotated[Path, typer.Option(
            help="Policy YAML: required results and thresholds (docs/gate.md).")],
        baseline: Annotated[list[Path] | None, typer.Option(
            help="Stored results that 'relative_to: baseline' thresholds compare with "
                 "(repeatable).")] = None,
        junit: Annotated[Path | None, typer.Option(
            help="Where to write the JUnit XML (default: gate/junit.xml inside the first "
                 "results folder).", show_default=False)] = None,
        markdown: Annotated[Path | None, typer.Option(
            help="Where to write the Markdown summary (default: gate/summary.md inside the "
                 "first results folder).", show_default=False)] = None,
        step_summary: Annotated[bool, typer.Option(
            "--step-summary/--no-step-summary",
            help="Also append the summary to $GITHUB_STEP_SUMMARY when it is set.")] = True,
    ) -> None:
        """Check results against a policy. Exit 0: every check passed; 1: a threshold was not
        met; 2: input the gate cannot trust (missing, NaN, partial or mismatched results, or an
        invalid policy). Writes JUnit XML and a Markdown summary either way, by default to
        gate/ inside the first results folder."""
        from ..gate import default_output, run_gate
        from .errors import check_out_file

        junit = junit or default_output(results, "junit.xml")
        markdown = markdown or default_output(results, "summary.md")
        check_out_file(junit, "--junit")
        check_out_file(markdown, "--markdown")
        res = run_gate(results, policy, baseline or None)
        res.write(junit, markdown)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary and summary:
            with open(summary, "a") as fh:
                fh.write(res.markdown() + "\n")
        console = Console(stderr=True)
        for line in res.warnings:
            typer.echo(f"warning: {line}", err=True)
        for c in res.errors:
            console.print(f"[red]error[/red] ({c.kind}) {escape(c.group)}: {escape(c.name)}: "
                          f"{escape(c.message)}", highlight=False, soft_wrap=True)
        for c in res.failures:
            console.print(f"[red]fail[/red] {escape(c.group)}: {escape(c.name)}: "
                          f"{escape(c.message)}", highlight=False, soft_wrap=True)
        console.print(f"gate {res.verdict}: {len(res.passed)} passed, {len(res.failures)} "
                      f"failed, {len(res.errors)} error(s)" +
                      (f", {len(res.skipped)} undecided (allowed)" if res.skipped else "") +
                      (f"; wrote {junit}" if junit else "") +
                      (f" and {markdown}" if markdown else ""), highlight=False)
        raise typer.Exit(res.exit_code)
