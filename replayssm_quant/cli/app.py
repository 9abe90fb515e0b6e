"""The ``replayssm-quant`` command. Each subcommand lives in its own module and registers
itself on ``app``; this file only assembles them."""

from __future__ import annotations

import importlib
import inspect

import typer

from .errors import user_errors

app = typer.Typer(
    name="replayssm-quant",
    help="Pick the lowest SSM-state precision that keeps a hybrid model accurate, "
    "and decode with it fast (ReplaySSM).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

@app.callback()
def _root() -> None:
    """Pick the lowest SSM-state precision that keeps a hybrid model accurate, and decode with
    it fast (ReplaySSM)."""


# Subcommand modules; each defines `register(app)`.
_COMMANDS = ("configs", "plan", "drift", "eval", "sweep", "recommend", "report", "gate")


def _load() -> None:
    for name in _COMMANDS:
        try:
            mod = importlib.import_module(f"replayssm_quant.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"replayssm_quant.cli.{name}":
                continue  # command not built into this install
            raise
        mod.register(app)
    for info in app.registered_commands:
        if info.callback is not None:  # every user error: one line on stderr, exit 2
            info.callback = user_errors(info.callback)
        # help from docstrings, one line per paragraph: the rich command list would otherwise
        # keep the docstring's line breaks
        doc = info.help or inspect.getdoc(info.callback) or ""
        info.help = "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n"))


_load()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
