"""Sweeps: a plan of models x configs x documents x tasks expanded into units run on Ray, each
writing the files the single ``drift`` and ``eval`` commands write."""

from .plan import Plan, PlanError, Unit, expand, load_plan
from .run import SweepResult, UnitOutcome, run_sweep

__all__ = ["Plan", "PlanError", "SweepResult", "Unit", "UnitOutcome", "expand", "load_plan",
           "run_sweep"]
