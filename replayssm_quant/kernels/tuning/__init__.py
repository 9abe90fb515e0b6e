"""Launch choices per GPU family, as data.

A family's table (``hopper.HOPPER``, measured on the H200) maps a choice's name to a
:class:`Choice`: the value the rules in ``rules.py``, ``mamba2_rules.py`` and ``gdn_rules.py``
read, and a one-line pointer to the measurement that chose it (commit + benchmark + result).
The planner (``kernels.plan``) and the verify launchers look the table up for their target
(``table_for``) and pass it to every rule (their ``table`` argument). Only the Hopper table
exists today and it is also ``DEFAULT_TABLE``, the one every other target (other GPUs, the
interpreter) plans with, so ``replayssm-quant plan`` prints the same plan for any of them.
Adding a family is one table module with the same keys and one line in ``FAMILY_TABLES``.
"""

from __future__ import annotations

from collections.abc import Mapping

from .choice import Choice
from .hopper import HOPPER

__all__ = ["DEFAULT_TABLE", "FAMILY_TABLES", "HOPPER", "Choice", "Table", "table_for"]

Table = Mapping[str, Choice]

# the measured table of each GPU family, keyed by the compute capability's major version
FAMILY_TABLES: dict[int, Table] = {9: HOPPER}

# what a target without a table of its own plans with
DEFAULT_TABLE: Table = HOPPER


def table_for(target: object = None) -> Table:
    """The tuning table of ``target``'s GPU family (a ``core.target.Target``; None: the
    default): its family's table for a CUDA target that has one, else ``DEFAULT_TABLE``."""
    if getattr(target, "cuda", False):
        return FAMILY_TABLES.get(target.capability[0], DEFAULT_TABLE)
    return DEFAULT_TABLE
