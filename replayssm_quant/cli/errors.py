"""One error path for every command: a user error (a path, file, model, data set, config or
option that cannot be used) ends in one line on stderr that names the bad value and what would
work, with exit code 2 and no traceback, before any long work starts.

Commands raise :class:`BadInput` for what they check themselves; library code raises its own
typed errors (``ModelUnavailable``, ``DataError``, ``ResultsError`` ...), which
:func:`user_errors` maps by name so this module imports nothing heavy.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

__all__ = ["BadInput", "USER_ERRORS", "check_in_path", "check_out_dir", "check_out_file", "fail",
           "one_line", "user_errors"]

EXIT_BAD_INPUT = 2

USER_ERRORS: frozenset[str] = frozenset({
    "replayssm_quant.cli.errors.BadInput",
    "replayssm_quant.evals.data.DataError",
    "replayssm_quant.evals.data.DataUnavailable",
    "replayssm_quant.evals.gutenberg.GutenbergUnavailable",
    "replayssm_quant.evals.tasks.TaskDataError",
    "replayssm_quant.evals.drift.NaNLogitsError",
    "replayssm_quant.evals.lm_backend.VLLMUnavailable",
    "replayssm_quant.models.loading.ModelUnavailable",
    "replayssm_quant.models.registry.UnsupportedArchitecture",
    "replayssm_quant.results.errors.InputError",
    "replayssm_quant.results.errors.ResultsError",
    "replayssm_quant.results.errors.PolicyError",
    "replayssm_quant.vllm_plugin.settings.ConfigError",
})
"""Exception classes (by qualified name; subclasses count) that mean the input cannot be used."""

F = TypeVar("F", bound=Callable[..., Any])


class BadInput(ValueError):
    """Input a command cannot use; the message names the value and what would work."""


def one_line(exc: BaseException | str) -> str:
    """The message as one line: several problems (``ResultsError``) are joined with '; '."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__ if isinstance(exc, BaseException) else "bad input"
    return "; ".join(lines)


def fail(message: BaseException | str) -> typer.Exit:
    """Print ``error: <message>`` on stderr and return the exit to raise (code 2)."""
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`USER_ERRORS` (or a subclass of one)."""
    return any(f"{c.__module__}.{c.__qualname__}" in USER_ERRORS for c in type(exc).__mro__)


def user_errors(command: F) -> F:
    """Wrap a command so every user error ends in one line and exit 2."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:
            if is_user_error(exc):
                raise fail(exc) from None
            raise

    return wrapped  # type: ignore[return-value]


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable_parent(path: Path, option: str, what: str) -> None:
    """The first existing folder above ``path`` must be a folder we can create entries in."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise BadInput(f"{option} {path}: {base} is a file, not a folder; give a {what} path "
                       "under a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".replayssm-probe-", dir=base)
    except OSError as exc:
        raise BadInput(f"{option} {path}: cannot create it, {base} is not writable "
                       f"({exc.strerror or exc}); give a {what} path in a writable folder"
                       ) from None
    os.rmdir(probe)


def check_out_dir(path: Path | str, option: str = "--out") -> Path:
    """An output folder that exists as a folder, or can be created: checked before long work."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise BadInput(f"{option} {p} is a file, not a folder; give a new or existing folder")
    if p.is_dir():
        _check_writable_parent(p / "x", option, "folder")
    else:
        _check_writable_parent(p, option, "folder")
    return p


def check_out_file(path: Path | str, option: str) -> Path:
    """An output file whose folder exists or can be created and that is not a folder itself."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise BadInput(f"{option} {p} is a folder; give a file path such as {p / 'out'}")
    _check_writable_parent(p, option, "file")
    return p


def check_in_path(path: Path | str, option: str, *, folder: bool | None = None) -> Path:
    """An input path that exists (a folder when ``folder`` is True, a file when False)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise BadInput(f"{option} {p} does not exist")
    if folder is True and not p.is_dir():
        raise BadInput(f"{option} {p} is a file; give a folder")
    if folder is False and not p.is_file():
        raise BadInput(f"{option} {p} is a folder; give a file")
    return p
