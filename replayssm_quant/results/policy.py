"""The gate's policy: its YAML schema (``docs/gate.md``, ``ci/drift_policy.yaml``) and its
compilation into the check language (:class:`~.criteria.Criteria`).

Unknown keys anywhere are errors, so a misspelt limit cannot silently disappear; every problem
of a policy is reported at once, one line each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .criteria import BOUND_KEYS, DRIFT_METRICS, RELATIVE_KEYS, TASK_METRICS, Check, Criteria
from .errors import PolicyError, read_yaml
from .evidence import Evidence
from .model import config_key

__all__ = ["load_policy", "parse_policy"]

_CHECK_KEYS = {"name", "source", "metric", "configs", "bucket", "tasks", "relative_to",
               *BOUND_KEYS}
_POLICY_KEYS = {"version", "models", "reference", "require", "evidence", "checks"}
_REQUIRE_KEYS = {"drift", "configs", "tasks"}
_EVIDENCE_KEYS = {"max_truncation_rate", "max_invalid_rate", "allow_undecided"}


def _names(value: Any, what: str, problems: list[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if value == "*":
        return ("*",)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{what} must be a list of names or '*'")
        return None
    return tuple(value)


def _number(value: Any, what: str, problems: list[str]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"{what} must be a finite number, got {value!r}")
        return None
    return float(value)


def parse_policy(data: Any, path: Path | None = None) -> Criteria:
    """Validate a policy mapping; :class:`PolicyError` lists every problem."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise PolicyError("a policy is a YAML mapping with 'version', 'require' and 'checks'")
    for k in sorted(set(data) - _POLICY_KEYS):
        problems.append(f"unknown key {k!r} (keys: {', '.join(sorted(_POLICY_KEYS))})")
    version = data.get("version", 1)
    if version != 1:
        problems.append(f"version must be 1, got {version!r}")
    models = _names(data.get("models"), "models", problems)
    if models == ("*",):
        models = None
    reference = data.get("reference", "fp32")
    if not isinstance(reference, str):
        problems.append("reference must be a config name or string")
        reference = "fp32"
    req = data.get("require") or {}
    if not isinstance(req, Mapping):
        problems.append("require must be a mapping")
        req = {}
    for k in sorted(set(req) - _REQUIRE_KEYS):
        problems.append(f"require: unknown key {k!r} (keys: {', '.join(sorted(_REQUIRE_KEYS))})")
    req_drift = req.get("drift", False)
    if not isinstance(req_drift, bool):
        problems.append("require.drift must be true or false")
        req_drift = False
    req_configs = _names(req.get("configs"), "require.configs", problems) or ()
    req_tasks = _names(req.get("tasks"), "require.tasks", problems) or ()
    for label in req_configs:
        if label != "*" and config_key(label) == label and "=" not in label:
            problems.append(f"require.configs: {label!r} is neither a preset nor a config string")
    evidence = _evidence(data.get("evidence"), problems)
    checks_raw = data.get("checks") or []
    if not isinstance(checks_raw, list):
        problems.append("checks must be a list")
        checks_raw = []
    if not checks_raw and not (req_configs or req_tasks or req_drift):
        problems.append("the policy checks nothing: give 'checks' or 'require'")
    checks: list[Check] = []
    names: set[str] = set()
    for i, c in enumerate(checks_raw):
        where = f"checks[{i}]"
        if not isinstance(c, Mapping):
            problems.append(f"{where} must be a mapping")
            continue
        for k in sorted(set(c) - _CHECK_KEYS):
            problems.append(f"{where}: unknown key {k!r} (keys: {', '.join(sorted(_CHECK_KEYS))})")
        source = c.get("source", "drift")
        if source not in ("drift", "tasks"):
            problems.append(f"{where}: source must be drift or tasks, got {source!r}")
            continue
        metric = c.get("metric")
        known = DRIFT_METRICS if source == "drift" else TASK_METRICS
        if metric not in known:
            problems.append(f"{where}: metric {metric!r} is not a {source} metric "
                            f"({', '.join(known)})")
            continue
        rel = c.get("relative_to")
        if rel not in (None, "reference", "baseline"):
            problems.append(f"{where}: relative_to must be reference or baseline, got {rel!r}")
            continue
        bounds = {k: _number(c.get(k), f"{where}: {k}", problems) for k in BOUND_KEYS}
        if all(v is None for v in bounds.values()):
            problems.append(f"{where}: no bound; give max/min, or with relative_to "
                            f"{'/'.join(RELATIVE_KEYS)}")
            continue
        rel_given = [k for k in RELATIVE_KEYS if bounds[k] is not None]
        if rel_given and rel is None:
            problems.append(f"{where}: {', '.join(rel_given)} need relative_to "
                            "(reference or baseline)")
            continue
        if rel is not None and not rel_given:
            problems.append(f"{where}: relative_to {rel} needs one of "
                            f"{', '.join(RELATIVE_KEYS)}")
            continue
        bucket = c.get("bucket", "last")
        if source == "tasks" and "bucket" in c:
            problems.append(f"{where}: bucket applies to drift checks only")
        if not isinstance(bucket, str):
            problems.append(f"{where}: bucket must be last, all, each or a bucket label")
            continue
        if source == "drift" and "tasks" in c:
            problems.append(f"{where}: tasks applies to task checks only")
        default = f"{source}-{metric}-{bucket if source == 'drift' else 'tasks'}"
        name = c.get("name") or (default + (f"-vs-{rel}" if rel else ""))
        if not isinstance(name, str):
            problems.append(f"{where}: name must be a string")
            continue
        if name in names:
            problems.append(f"{where}: name {name!r} used twice")
        names.add(name)
        checks.append(Check(
            name=name, source=source, metric=metric,
            configs=_names(c.get("configs"), f"{where}: configs", problems),
            bucket=bucket, tasks=_names(c.get("tasks"), f"{where}: tasks", problems),
            relative_to=rel, **bounds))
    if problems:
        where = f"{path}: " if path else ""
        raise PolicyError("\n".join(where + p for p in problems))
    return Criteria(version=1, models=models, reference=reference, require_drift=req_drift,
                  require_configs=req_configs, require_tasks=req_tasks, checks=tuple(checks),
                  evidence=evidence, path=path)


def _evidence(raw: Any, problems: list[str]) -> Evidence:
    """The ``evidence:`` block: when task evidence can decide a check (:mod:`.evidence`)."""
    if raw is None:
        return Evidence()
    if not isinstance(raw, Mapping):
        problems.append("evidence must be a mapping")
        return Evidence()
    for k in sorted(set(raw) - _EVIDENCE_KEYS):
        problems.append(f"evidence: unknown key {k!r} (keys: {', '.join(sorted(_EVIDENCE_KEYS))})")
    default = Evidence()
    rates = {}
    for k in ("max_truncation_rate", "max_invalid_rate"):
        if k in raw and raw[k] is None:
            rates[k] = None
            continue
        v = _number(raw.get(k, getattr(default, k)), f"evidence.{k}", problems)
        if v is not None and not 0 <= v <= 1:
            problems.append(f"evidence.{k} is a fraction in [0, 1] (0.1 = 10%), got {v}")
        rates[k] = v
    allow = raw.get("allow_undecided", False)
    if not isinstance(allow, bool):
        problems.append("evidence.allow_undecided must be true or false")
        allow = False
    return Evidence(rates["max_truncation_rate"], rates["max_invalid_rate"],
                    allow_undecided=allow)


def load_policy(path: str | Path) -> Criteria:
    p = Path(path)
    return parse_policy(read_yaml(p, "policy", PolicyError, lambda message: " ".join(message.split())), p)
