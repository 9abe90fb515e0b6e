"""Errors of the results layer: results that cannot be read, and criteria (budgets, policies,
benchmarks) that cannot be used. Each carries one line per problem so a command can print them
all at once instead of stopping at the first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["InputError", "PolicyError", "ResultsError", "read_yaml"]


class ResultsError(ValueError):
    """Results that cannot be read: ``problems`` has one line per problem and ``kinds`` the
    class of each (``missing``: no such folder or no summary; ``partial``: an unfinished run;
    ``invalid``: not the schema), so the gate can report each the way CI expects."""

    def __init__(self, problems: Sequence[str] | str,
                 kinds: Sequence[str] | str = "invalid") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.kinds = ([kinds] * len(self.problems) if isinstance(kinds, str) else list(kinds))
        super().__init__("\n".join(self.problems))


class InputError(ValueError):
    """Input the recommender cannot use (budget, benchmark, shape): the CLI exits 2."""


class PolicyError(ValueError):
    """A policy file the gate cannot use; one line per problem."""


def read_yaml(path: Path, what: str, error: type[ValueError],
              yaml_problem: Callable[[str], str]) -> Any:
    """The parsed YAML of ``path`` (a budget or a policy); a file that cannot be read or parsed
    is one ``error`` naming the file (``yaml_problem`` shortens the parser's message)."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {yaml_problem(str(e))}") from None
