"""``replayssm-quant sweep PLAN.yaml``: a plan's drift and eval units on Ray, resumable."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn

from .console import fitted_columns
from .errors import BadInput, check_out_dir, fail

EXIT_UNITS_FAILED = 1


class _UnitLines:
    """One line per finished unit (a log), under a live bar over the units on a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: Progress | None = None
        self.task = None
        self.t0 = time.perf_counter()

    def started(self, total: int, dashboard_url: str) -> None:
        if dashboard_url:
            self.console.print(f"Ray dashboard: {dashboard_url}", markup=False, highlight=False)
        self.console.print(f"{total} units", markup=False, highlight=False)
        if self.console.is_terminal:
            columns = (*fitted_columns(self.console.width, 24), MofNCompleteColumn(),
                       TimeElapsedColumn())
            self.progress = Progress(*columns, console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task("units", total=total)

    def finished(self, outcome, done: int, total: int) -> None:
        if outcome.ok:
            how = f"done in {outcome.seconds:.1f} s" if outcome.ran else "cached"
        elif outcome.skipped:
            how = f"not run: waits for failed {outcome.skipped}"
        else:
            how = f"FAILED: {outcome.error}"
        self.console.print(f"[{done}/{total}] {outcome.id}: {how}", markup=False,
                           highlight=False, soft_wrap=True)
        if self.progress is not None:
            self.progress.update(self.task, completed=done, description=outcome.id)

    def stop(self) -> None:
        if self.progress is not None and self.progress.live.is_started:
            self.progress.stop()


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep(
        plan_path: Annotated[Path, typer.Argument(
            metavar="PLAN.yaml", help="The sweep plan (docs/sweeps.md; ci/sweep_example.yaml).")],
        address: Annotated[str | None, typer.Option(
            help="Join this Ray cluster (auto: the one `ray start` made on this machine). "
                 "Default: start a local Ray on this machine's CPUs and GPUs.")] = None,
        workers: Annotated[int | None, typer.Option(
            help="Units running at once, at most (default: as many as the resources "
                 "allow).")] = None,
        retries: Annotated[int, typer.Option(
            help="Retries of a unit that fails before it is reported failed.")] = 1,
        out: Annotated[Path | None, typer.Option(
            help="Output folder (default: the plan's out). A rerun with the same folder "
                 "resumes.")] = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Check the plan and list its units; run nothing.")] = False,
    ) -> None:
        """Run a plan of models x configs x drift documents x eval tasks as units on Ray, each
        writing the files `drift` and `eval` write (one folder per model and kind), so
        recommend, report and gate read a sweep as they read single runs. A rerun resumes;
        exit 1 names the units that failed, exit 2 a plan that cannot run."""
        from dataclasses import replace

        from ..sweep.plan import PlanError, expand, load_plan
        from ..sweep.units import RESPONDER_ENV

        err = Console(stderr=True)
        if workers is not None and workers < 1:
            raise BadInput(f"--workers must be >= 1, got {workers}")
        if retries < 0:
            raise BadInput(f"--retries must be >= 0, got {retries}")
        try:
            plan = load_plan(plan_path)
        except PlanError as e:
            raise fail(e) from None
        if out is not None:
            plan = replace(plan, out=out.expanduser().resolve())
        check_out_dir(plan.out)
        units = expand(plan)
        if dry_run:
            for u in units:
                wait = f" (after {len(u.after)})" if u.after else ""
                typer.echo(f"{u.id}{wait}")
            return
        try:
            import ray  # noqa: F401
        except ImportError:
            raise fail("sweep needs Ray, which is not installed (pip install "
                       "'replayssm-quant[sweep]')") from None
        from ..sweep.run import run_sweep

        lines = _UnitLines(err)
        t0 = time.perf_counter()
        try:
            result = run_sweep(plan, address=address, workers=workers, retries=retries,
                               responder=os.environ.get(RESPONDER_ENV) or None,
                               progress=lines, units=units)
        finally:
            lines.stop()
        ran = sum(o.ran for o in result.outcomes if o.ok)
        err.print(f"{len(result.outcomes)} units in {time.perf_counter() - t0:.1f} s: {ran} run, "
                  f"{sum(o.ok for o in result.outcomes) - ran} cached, {len(result.failed)} "
                  f"failed, {len(result.skipped)} not run; results in {plan.out}/",
                  markup=False, highlight=False, soft_wrap=True)
        if not result.ok:
            failed = "; ".join(f"{o.id} ({o.error})" for o in result.failed)
            text = f"error: {len(result.failed)} unit(s) failed: {failed}"
            if result.skipped:
                text += ("; not run (waiting for a failed unit): " +
                         ", ".join(o.id for o in result.skipped))
            typer.echo(text + "; rerun the same command to retry them", err=True)
            raise typer.Exit(EXIT_UNITS_FAILED)
