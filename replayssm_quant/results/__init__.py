"""Results and criteria: the typed records of drift, task and benchmark results with their
loaders, and the one check language (:mod:`.criteria`) that the recommender's budgets and the
gate's policies compile into.

Layering: this package reads files and judges numbers; it renders nothing (``report/`` does)
and imports nothing above ``precision``.
"""

from .benchmark import Benchmark, BenchmarkRow, benchmark_from_rows, load_benchmark
from .budget import DEFAULT_BUDGET, Budget
from .criteria import Check, Criteria, Outcome, evaluate, judge
from .drift import load_drift
from .errors import InputError, PolicyError, ResultsError
from .evidence import Evidence
from .folders import load_results
from .model import (
    DRIFT_REQUIRED_STATS,
    TASK_REQUIRED_FIELDS,
    BucketSpec,
    DriftConfig,
    DriftResults,
    DriftStats,
    Issue,
    ModelResults,
    ResultSet,
    TaskResults,
    TaskRow,
    config_key,
)
from .policy import load_policy, parse_policy
from .tasks import load_tasks
from .verify import verify_files

__all__ = [
    "DEFAULT_BUDGET",
    "DRIFT_REQUIRED_STATS",
    "TASK_REQUIRED_FIELDS",
    "Benchmark",
    "BenchmarkRow",
    "BucketSpec",
    "Budget",
    "Check",
    "Criteria",
    "DriftConfig",
    "DriftResults",
    "DriftStats",
    "Evidence",
    "InputError",
    "Issue",
    "ModelResults",
    "Outcome",
    "PolicyError",
    "ResultSet",
    "ResultsError",
    "TaskResults",
    "TaskRow",
    "benchmark_from_rows",
    "config_key",
    "evaluate",
    "judge",
    "load_benchmark",
    "load_drift",
    "load_policy",
    "load_results",
    "load_tasks",
    "parse_policy",
    "verify_files",
]
