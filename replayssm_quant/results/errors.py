"""Errors of the results layer: results that cannot be read, and criteria (budgets, policies,
benchmarks) that cannot be used. Each carries one line per problem so a command can print them
all at once instead of stopping at the first."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["InputError", "PolicyError", "ResultsError"]


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
