"""Loader of drift folders (``replayssm-quant drift``): one ``summary.json`` validated into a
:class:`~replayssm_quant.results.model.DriftResults`, every config string parsed once."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..precision import PrecisionConfig, parse_config
from .errors import ResultsError
from .model import DRIFT_REQUIRED_STATS, BucketSpec, DriftConfig, DriftResults, DriftStats, Issue
from .reading import list_or_empty, num, opt_int, read_json, shape_from

__all__ = ["load_drift"]

_DRIFT_CORE = ("kl_mean", "same_top1", "ppl_ratio")
"""Drift metrics that are finite in any sound run: a NaN here is an :class:`Issue`."""


def _stats(block: Any, where: str, problems: list[str], issues: list[Issue],
           bucket: str, lo: int | None, hi: int | None, config: str) -> DriftStats | None:
    if not isinstance(block, dict):
        problems.append(f"{where}: must be an object")
        return None
    missing = [k for k in DRIFT_REQUIRED_STATS if k not in block]
    if missing:
        problems.append(f"{where}: lacks {', '.join(repr(k) for k in missing)}")
        return None
    values: dict[str, float] = {}
    for k, v in block.items():
        if k in ("bucket", "lo", "hi"):
            continue
        try:
            values[k] = num(v)
        except TypeError as e:
            problems.append(f"{where}: {k!r} must be a number or null, got {e}")
    nan = [k for k in _DRIFT_CORE if k in values and not math.isfinite(values[k])]
    if nan and values.get("n", 0) > 0:
        issues.append(Issue("nan", where, f"{', '.join(nan)} is NaN or infinite", config))
    return DriftStats(bucket, lo, hi, values)


def load_drift(path: str | Path, raw: dict | None = None) -> DriftResults:
    """Validate a drift folder (or its ``summary.json``); raises :class:`ResultsError`."""
    p = Path(path)
    file = p / "summary.json" if p.is_dir() else p
    obj = raw if raw is not None else read_json(file)
    where = str(file)
    problems: list[str] = []
    issues: list[Issue] = []
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        problems.append(f"{where}: 'model' must be a non-empty string")
        model = "?"
    specs: list[BucketSpec] = []
    buckets = list_or_empty(obj.get("buckets"), f"{where}: 'buckets' must be a list of {{bucket, lo, hi}}",
                            problems)
    for i, b in enumerate(buckets):
        try:
            specs.append(BucketSpec(str(b["bucket"]), int(b["lo"]), int(b["hi"])))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{where}: buckets[{i}] must be {{bucket, lo, hi}}, got {b!r}")
    if [s.lo for s in specs] != sorted(s.lo for s in specs):
        problems.append(f"{where}: buckets are not in ascending order")
    configs_raw = obj.get("configs")
    if not isinstance(configs_raw, list) or not configs_raw:
        problems.append(f"{where}: 'configs' must be a non-empty list")
        configs_raw = []
    positions = opt_int(obj, "positions_per_config", where, problems)
    configs: list[DriftConfig] = []
    seen: dict[PrecisionConfig, str] = {}
    labels = [s.bucket for s in specs]
    for i, c in enumerate(configs_raw):
        cw = f"{where}: configs[{i}]"
        if not isinstance(c, dict):
            problems.append(f"{cw}: must be an object")
            continue
        name, text = c.get("name"), c.get("config")
        if not isinstance(text, str):
            problems.append(f"{cw}: 'config' must be a config string")
            continue
        try:
            canon = parse_config(text)
        except ValueError as e:
            problems.append(f"{cw}: config {text!r} does not parse: {e}")
            continue
        name = name if isinstance(name, str) and name else str(canon)
        cw = f"{where}: config {name!r}"
        if canon in seen:
            problems.append(f"{cw}: config {canon} appears twice (also as {seen[canon]!r})")
            continue
        seen[canon] = name
        overall_raw = c.get("overall")
        overall = None
        if not overall_raw:
            issues.append(Issue("partial", cw, "no overall statistics (no positions scored)",
                                canon))
        else:
            overall = _stats(overall_raw, f"{cw} overall", problems, issues, "all", None, None,
                             canon)
        blocks: list[DriftStats] = []
        braw = list_or_empty(c.get("buckets"), f"{cw}: 'buckets' must be a list", problems)
        for j, b in enumerate(braw):
            if not isinstance(b, dict) or not isinstance(b.get("bucket"), str):
                problems.append(f"{cw}: buckets[{j}] must be an object with a 'bucket' label")
                continue
            lo, hi = b.get("lo"), b.get("hi")
            s = _stats(b, f"{cw} bucket {b['bucket']}", problems, issues, b["bucket"],
                       lo if isinstance(lo, int) else None, hi if isinstance(hi, int) else None,
                       canon)
            if s is not None:
                blocks.append(s)
        have = {b.bucket for b in blocks}
        absent = [lab for lab in labels if lab not in have]
        if absent:
            issues.append(Issue("partial", cw, f"no statistics for bucket(s) {', '.join(absent)}",
                                canon))
        extra = sorted(have - set(labels))
        if extra:
            problems.append(f"{cw}: bucket(s) {', '.join(extra)} are not in the summary's "
                            "'buckets'")
        if overall is not None and positions is not None:
            n = overall.values.get("n", math.nan)
            if math.isfinite(n) and int(n) != positions:
                issues.append(Issue("partial", cw, f"{int(n)} positions scored, the run has "
                                                   f"{positions} per config", canon))
        configs.append(DriftConfig(name, canon, overall, tuple(blocks)))
    shape = shape_from(obj.get("ssm_shape"), model, where, problems)
    spectrum = obj.get("decay_spectrum")
    if spectrum is not None and not (isinstance(spectrum, dict) and
                                     isinstance(spectrum.get("layers"), list)):
        problems.append(f"{where}: 'decay_spectrum' must be an object with a 'layers' list")
        spectrum = None
    ints = {k: opt_int(obj, k, where, problems)
            for k in ("seed", "prefill", "max_tokens", "tokens")}
    if problems:
        raise ResultsError(problems)
    plot = file.parent / "kl_vs_position.png"
    return DriftResults(
        path=file.parent, model=model, model_type=obj.get("model_type"), shape=shape,
        data=obj.get("data"), seed=ints["seed"], prefill=ints["prefill"],
        max_tokens=ints["max_tokens"], tokens=ints["tokens"], positions_per_config=positions,
        reference=obj.get("reference"), buckets=tuple(specs), configs=tuple(configs),
        decay_spectrum=spectrum, plot=plot if plot.is_file() else None, issues=tuple(issues),
        raw=obj,
    )


