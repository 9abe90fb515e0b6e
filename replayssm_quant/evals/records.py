"""What a writer records in ``summary.json`` about the data files beside it, so every reader
can tell a complete file from one cut short or altered (``replayssm_quant.results.verify``
checks these records)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["file_records", "sha256_of"]


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (the writers record it, the readers check it)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_records(folder: Path, names: Iterable[str]) -> dict[str, dict]:
    """``{name: {"rows", "bytes", "sha256"}}`` of each file ``folder / name`` (a path relative to
    the folder); ``rows`` is the parquet row count (None for other files)."""
    import pyarrow.parquet as pq

    out: dict[str, dict] = {}
    for name in names:
        path = folder / name
        rows = pq.read_metadata(path).num_rows if path.suffix == ".parquet" else None
        out[name] = {"rows": rows, "bytes": path.stat().st_size, "sha256": sha256_of(path)}
    return out
