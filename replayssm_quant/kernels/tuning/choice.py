"""One tuned launch choice: the value a rule reads and the measurement that chose it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    """A tuned launch choice: its ``value`` and the ``evidence`` that chose it, one line
    (commit, benchmark, result)."""

    value: Any
    evidence: str
