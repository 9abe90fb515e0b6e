"""Console output that reads at any width and in logs.

A table is printed as a table when it fits the console (the terminal, or ``$COLUMNS`` / 80
columns when output is redirected), else as one record per line, so no value or name is ever
cut. Progress is a live display only on a terminal; in a log it is one plain line per finished
unit. Library warnings (documents shorter than asked ...) print as ``warning: ...`` lines.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, TextColumn
from rich.table import Column, Table
from rich.text import Text

__all__ = ["PlainProgressLines", "fitted_columns", "print_table", "show_warnings",
           "table_records"]


def _cell_text(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return str(cell)


def table_records(table: Table) -> list[str]:
    """One line per row: ``<first cell>: <header> <value>, ...`` (empty values left out)."""
    columns = table.columns
    cells = [[_cell_text(c) for c in col.cells] for col in columns]
    lines = []
    for i in range(table.row_count):
        head = " ".join(cells[0][i].split())
        parts = [f"{_cell_text(col.header)} {' '.join(cells[j][i].split())}"
                 for j, col in enumerate(columns[1:], 1) if cells[j][i].strip()]
        lines.append(f"{head}: " + ", ".join(parts))
    return lines


def print_table(console: Console, table: Table, note: str | None = None) -> None:
    """``table`` if its natural width fits ``console``, else its title and one record per line;
    ``note`` (how to read it) goes under it either way."""
    width = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if width <= console.width:
        console.print(table)
    else:
        if table.title:
            console.print(_cell_text(table.title), markup=False, highlight=False,
                          soft_wrap=True)
        for line in table_records(table):
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if note:
        console.print(note, markup=False, highlight=False, soft_wrap=True, style="dim")


def fitted_columns(width: int, rest: int) -> tuple[TextColumn, BarColumn]:
    """A description and a bar column that, with ``rest`` columns of other fields, fit one line
    of ``width``: a live display that wraps scrolls a copy per refresh."""
    desc = TextColumn("{task.description}", table_column=Column(
        no_wrap=True, overflow="ellipsis", max_width=max(16, width // 3)))
    return desc, BarColumn(bar_width=max(6, min(40, width - rest - max(16, width // 3) - 2)))


class PlainProgressLines:
    """Drift progress for logs: one line per finished (document, config) unit, no live bar."""

    def __init__(self, console: Console, label: str) -> None:
        self.console = console
        self.label = label
        self.total = 0
        self.done = 0
        self.t0 = time.perf_counter()

    def start(self, total_tokens: int) -> None:
        self.total = total_tokens
        self.t0 = time.perf_counter()
        if total_tokens == 0:
            self.console.print(f"{self.label}: cached", markup=False, highlight=False)

    def advance(self, tokens: int, description: str) -> None:
        self.done += tokens
        pct = 100 * self.done / self.total if self.total else 100.0
        self.console.print(f"{description}: done ({self.done:,}/{self.total:,} tokens, "
                           f"{pct:.0f}%, {time.perf_counter() - self.t0:.1f} s)",
                           markup=False, highlight=False, soft_wrap=True)


class _WarningLines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(f"warning: {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a log line must never end the run
            self.handleError(record)


def show_warnings(loggers: Iterable[str] = ("replayssm_quant",)) -> None:
    """Print the package's warnings as ``warning: ...`` lines on stderr (added once per
    logger; they still propagate, so the root logger's handlers see them too)."""
    for name in loggers:
        log = logging.getLogger(name)
        if not any(isinstance(h, _WarningLines) for h in log.handlers):
            log.addHandler(_WarningLines(logging.WARNING))
