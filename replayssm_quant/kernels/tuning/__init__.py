"""Launch choices per GPU family, as data.

A family's table (``hopper.HOPPER``, measured on the H200) maps a choice's name to a
:class:`Choice`: the value the rules in ``rules.py``, ``mamba2_rules.py`` and ``gdn_rules.py``
read, and a one-line pointer to the measurement that chose it (commit + benchmark + result).
Only the Hopper table exists today; every target (other GPUs, the interpreter) plans with it,
so ``replayssm-quant plan`` prints the same plan for any of them.
"""

from __future__ import annotations

from .choice import Choice
from .hopper import HOPPER

__all__ = ["HOPPER", "Choice", "table_for"]


def table_for(target: object = None) -> dict[str, Choice]:
    """The tuning table of ``target``'s GPU family (a ``core.target.Target``; None: the
    default). Hopper's is the only one, so it serves every target."""
    return HOPPER
