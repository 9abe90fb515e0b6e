"""Check a result folder's data files against what its ``summary.json`` records for them.

The drift and eval writers record, under ``"files"``, each data file they put next to the
summary (path relative to the folder: ``rows``, ``bytes``, ``sha256``). A reader that trusted
the summary alone would pass a folder whose ``drift.parquet`` or ``items.parquet`` was cut short
by a full disk or a bad copy; so every loader checks the size, the checksum and (for parquet)
the row count, and a file that does not match is a :class:`ResultsError` naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..evals.records import sha256_of
from .errors import ResultsError

__all__ = ["RERUN", "sha256_of", "verify_files"]

RERUN = {"drift": "replayssm-quant drift", "tasks": "replayssm-quant eval"}
"""The command that writes each kind of folder (what to rerun when a file is damaged)."""


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _problem(path: Path, record: Any) -> str | None:
    if not isinstance(record, dict):
        return "its record in summary.json is not an object"
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    want_size = record.get("bytes")
    if isinstance(want_size, int) and size != want_size:
        what = "truncated" if size < want_size else "altered"
        return f"{what} ({size} bytes, summary.json records {want_size})"
    want_sha = record.get("sha256")
    if isinstance(want_sha, str) and sha256_of(path) != want_sha:
        return "altered (its sha256 differs from the one summary.json records)"
    want_rows = record.get("rows")
    if isinstance(want_rows, int) and path.suffix == ".parquet":
        try:
            rows = _parquet_rows(path)
        except Exception as e:  # noqa: BLE001 - any unreadable parquet is the same problem
            return f"unreadable as parquet ({type(e).__name__})"
        if rows != want_rows:
            return f"has {rows} rows, summary.json records {want_rows}"
    return None


def verify_files(folder: Path, summary: dict, kind: str) -> bool:
    """Verify every data file ``summary`` records (paths relative to ``folder``); raises
    :class:`ResultsError` (one line per bad file) on a missing, truncated or altered one.
    Returns False when the summary records no files (written before the record existed)."""
    records = summary.get("files")
    if records is None:
        return False
    command = RERUN.get(kind, "the command")
    if not isinstance(records, dict):
        raise ResultsError(f"{folder / 'summary.json'}: 'files' must map file names to "
                           f"records; rerun the command that made it ({command})")
    problems = []
    for name, record in records.items():
        path = folder / name
        problem = _problem(path, record)
        if problem is not None:
            problems.append(f"{path}: {problem}; rerun the command that made it ({command})")
    if problems:
        raise ResultsError(problems, "invalid")
    return True
