"""Documents for the drift evaluation, as token ids.

Sources (the ``--data`` spec):

* ``pg19`` / ``pg19:<repo>[:<split>]``: PG-19 books from a parquet mirror on the Hugging Face hub
  (default :data:`PG19_REPO`, split ``test``), streamed with ``datasets`` so only the books used
  are downloaded. ``deepmind/pg19`` itself is a loading script ``datasets>=4`` refuses.
* a path: a ``.txt`` / ``.parquet`` / ``.jsonl`` file, or a folder of them, in PG-19's schema
  (``short_book_title, publication_date, url, text``; only ``text`` is required). A ``.txt``
  file is one document.
* ``gutenberg``: the held-out Project Gutenberg plays (:mod:`replayssm_quant.evals.gutenberg`),
  available offline from a package registry.
* ``self:N``: ``N`` tokens sampled (temperature 1, seeded) from the reference model itself, to
  measure drift along the model's own generation.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..models import loading

__all__ = [
    "PG19_REPO",
    "PG19_SPLIT",
    "DataError",
    "DataUnavailable",
    "Document",
    "load_documents",
    "read_local",
    "sample_self",
]

log = logging.getLogger(__name__)

PG19_REPO = "emozilla/pg19-test"
PG19_SPLIT = "test"
LOCAL_SUFFIXES = (".txt", ".parquet", ".jsonl")
MAX_REPLACEMENT_SHARE = 0.01
"""Text with more than 1% U+FFFD after decoding (or any NUL) is taken for a binary file."""
CHARS_PER_TOKEN_BOUND = 12
"""Text is cut to ``max_tokens * 12`` characters before tokenising (retokenised in full if that
was not enough), so a 400K-word book is not tokenised to keep 2K tokens."""


class DataUnavailable(RuntimeError):
    """A data source cannot be reached (offline hub, missing archive)."""


class DataError(ValueError):
    """A data spec or local file that cannot be used (unknown spec, wrong schema, too short)."""


@dataclass(frozen=True)
class Document:
    """One evaluation document: ``tokens`` is a 1-D int64 tensor; ``doc_id`` is stable across runs
    (it names the resumable result files); ``name`` is for people."""

    doc_id: str
    name: str
    tokens: torch.Tensor
    source: str

    def __len__(self) -> int:
        return int(self.tokens.numel())


@dataclass(frozen=True)
class _Text:
    doc_id: str
    name: str
    text: str


# ----------------------------------------------------------------------------------- tokenising
def _tokenize(tokenizer: Any, text: str, max_tokens: int) -> torch.Tensor:
    cut = text[: max_tokens * CHARS_PER_TOKEN_BOUND]
    ids = tokenizer(cut, add_special_tokens=True)["input_ids"]
    if len(ids) < max_tokens and len(cut) < len(text):
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    return torch.tensor(ids[:max_tokens], dtype=torch.int64)


def _counts(items: list[tuple[str, int]]) -> str:
    shown = ", ".join(f"{name}: {n:,}" for name, n in items[:5])
    return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")


def _documents(texts: Iterable[_Text], tokenizer: Any, *, max_tokens: int, docs: int,
               min_tokens: int, source: str, strict: bool = False) -> list[Document]:
    """Tokenised documents; the ones shorter than asked are named in one warning (an error with
    ``strict``), the ones too short to use in the error when none is left."""
    out: list[Document] = []
    skipped: list[tuple[str, int]] = []
    for t in texts:
        if len(out) >= docs:
            break
        ids = _tokenize(tokenizer, t.text, max_tokens)
        if ids.numel() < min_tokens:
            skipped.append((t.name, int(ids.numel())))
            continue
        out.append(Document(t.doc_id, t.name, ids, source))
    if not out:
        raise DataError(f"no document of {source!r} has the {min_tokens:,} tokens needed"
                        + (f" ({_counts(skipped)} tokens)" if skipped else ""))
    short = [(d.name, len(d)) for d in out if len(d) < max_tokens]
    problems = []
    running = "" if strict else "; running on "
    if len(short) == 1:
        name, n = short[0]
        problems.append(f"{name}: {n:,} tokens of the {max_tokens:,} asked"
                        + (f"{running}{n:,}" if running else ""))
    elif short:
        problems.append(f"{len(short)} documents are shorter than the {max_tokens:,} tokens "
                        f"asked ({_counts(short)})" + (f"{running}what they hold" if running else ""))
    if len(out) < docs:
        problems.append(f"{len(out)} document(s) of the {docs} asked in {source!r}")
    if skipped:
        problems.append(f"skipped {len(skipped)} shorter than the {min_tokens:,} tokens needed "
                        f"({_counts(skipped)})")
    if problems and strict:
        raise DataError("; ".join(problems) + " (--strict: ask for fewer tokens or documents, "
                        "or give more text)")
    if problems:
        log.warning("%s", "; ".join(problems) + " (--strict makes this an error)")
    return out


# ----------------------------------------------------------------------------------- local
def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_")[:80] or "doc"


def _local_files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix.lower() not in LOCAL_SUFFIXES:
            raise DataError(f"{path}: unsupported file type; use {', '.join(LOCAL_SUFFIXES)}")
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and p.suffix.lower() in LOCAL_SUFFIXES)
        if not files:
            raise DataError(f"{path} holds no {', '.join(LOCAL_SUFFIXES)} files")
        return files
    raise DataError(f"data path {path} does not exist")


def check_text(text: str, where: str) -> str:
    """``text`` unless it looks like a binary file read as text (NUL bytes, or more than
    :data:`MAX_REPLACEMENT_SHARE` of U+FFFD replacement characters after decoding)."""
    nul = text.find("\x00")
    if nul >= 0:
        raise DataError(f"{where} is not text (a NUL byte at character {nul:,}); give UTF-8 "
                        "text (.txt) or the PG-19 schema (.parquet/.jsonl)")
    bad = text.count("\ufffd")
    if text and bad > MAX_REPLACEMENT_SHARE * len(text):
        raise DataError(f"{where} is not UTF-8 text ({100 * bad / len(text):.0f}% of its "
                        "characters do not decode); give UTF-8 text (.txt) or the PG-19 schema "
                        "(.parquet/.jsonl)")
    return text


def _rows(path: Path) -> Iterator[dict]:
    import pandas as pd

    if path.suffix.lower() == ".parquet":
        frame = pd.read_parquet(path)
    else:
        frame = pd.read_json(path, lines=True)
    if "text" not in frame.columns:
        raise DataError(f"{path} has no 'text' column (PG-19 schema: short_book_title, "
                        f"publication_date, url, text); columns: {list(frame.columns)}")
    yield from frame.to_dict("records")


def read_local(path: str | Path) -> Iterator[_Text]:
    """Texts of a local file or folder, in sorted file order then row order."""
    root = Path(path).expanduser()
    for f in _local_files(root):
        rel = f.relative_to(root) if root.is_dir() else Path(f.name)
        if f.suffix.lower() == ".txt":
            text = f.read_bytes().decode("utf-8", errors="replace")
            yield _Text(f"file/{_slug(str(rel))}", f.stem, check_text(text, str(f)))
            continue
        for i, row in enumerate(_rows(f)):
            title = row.get("short_book_title") or f"{f.stem}[{i}]"
            text = row["text"]
            if not isinstance(text, str):
                continue
            yield _Text(f"file/{_slug(str(rel))}/{i}", str(title),
                        check_text(text, f"{f} row {i}"))


# ----------------------------------------------------------------------------------- hub
def read_pg19(repo: str = PG19_REPO, split: str = PG19_SPLIT) -> Iterator[_Text]:
    """PG-19 books streamed from a hub parquet mirror (or ``datasets``' cache when offline)."""
    hint = ("pass --data PATH with local .txt/.parquet/.jsonl files (PG-19 schema), or "
            "--data gutenberg")
    try:
        from datasets import load_dataset
    except ImportError:
        raise DataUnavailable(
            "PG-19 needs the 'datasets' package: pip install 'replayssm-quant[eval]'; or " + hint
        ) from None
    if not loading.hub_offline() and not loading.hub_reachable():
        raise DataUnavailable(f"PG-19 ({repo}, split {split}) is not reachable: the Hugging Face "
                              f"hub cannot be contacted (offline?); {hint}")
    try:
        ds = load_dataset(repo, split=split, streaming=True)
        rows = iter(ds)
        first = next(rows, None)
    except Exception as exc:  # datasets raises many types for an unreachable/absent repo
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataUnavailable(f"PG-19 ({repo}, split {split}) could not be loaded: {msg}; "
                              f"{hint}") from None
    if first is None:
        return
    for i, row in enumerate(_chain(first, rows)):
        if "text" not in row:
            raise DataError(f"{repo} rows have no 'text' field: {sorted(row)}")
        title = row.get("short_book_title") or f"book {i}"
        yield _Text(f"pg19/{_slug(repo)}/{split}/{i}", str(title), row["text"])


def _chain(first: dict, rest: Iterator[dict]) -> Iterator[dict]:
    yield first
    yield from rest


# ----------------------------------------------------------------------------------- gutenberg
def read_gutenberg() -> Iterator[_Text]:
    """The held-out plays, in :data:`~replayssm_quant.evals.gutenberg.HELD_OUT` order."""
    from .gutenberg import HELD_OUT, GutenbergUnavailable, split_plays

    try:
        _, held_out = split_plays()
    except GutenbergUnavailable as exc:
        raise DataUnavailable(str(exc).splitlines()[0]) from None
    for name in HELD_OUT:
        yield _Text(f"gutenberg/{name}", name, held_out[name])


# ----------------------------------------------------------------------------------- self
@torch.no_grad()
def sample_self(model: torch.nn.Module, tokenizer: Any, n_tokens: int, *, seed: int,
                device: str | torch.device | None = None) -> torch.Tensor:
    """``n_tokens`` ids: a one-token prompt (BOS, else EOS, else 0) plus tokens sampled at
    temperature 1 from the full distribution of the unpatched model, seeded."""
    start = next((t for t in (getattr(tokenizer, "bos_token_id", None),
                              getattr(tokenizer, "eos_token_id", None)) if t is not None), 0)
    dev = device or next(model.parameters()).device
    prompt = torch.tensor([[start]], dtype=torch.int64, device=dev)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        if torch.device(dev).type == "cuda":
            torch.cuda.manual_seed_all(seed)
        out = model.generate(prompt, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             min_new_tokens=n_tokens - 1, max_new_tokens=n_tokens - 1,
                             use_cache=True, pad_token_id=start)
    return out[0, :n_tokens].cpu()


# ----------------------------------------------------------------------------------- entry
def load_documents(spec: str, tokenizer: Any, *, max_tokens: int, docs: int = 1,
                   min_tokens: int = 2, model: torch.nn.Module | None = None, seed: int = 0,
                   pg19_repo: str = PG19_REPO, pg19_split: str = PG19_SPLIT,
                   strict: bool = False) -> list[Document]:
    """Up to ``docs`` documents of ``spec`` tokenised with ``tokenizer`` and cut to ``max_tokens``.

    Documents shorter than ``min_tokens`` are skipped; raises :class:`DataError` when none is
    left, :class:`DataUnavailable` when the source cannot be reached. Fewer tokens or documents
    than asked is one logged warning, or a :class:`DataError` with ``strict``.
    """
    if max_tokens < 2:
        raise DataError(f"max_tokens (tokens per document) must be >= 2, got {max_tokens}")
    if docs < 1:
        raise DataError(f"docs must be >= 1, got {docs}")
    spec = spec.strip()
    kw = dict(max_tokens=max_tokens, docs=docs, min_tokens=min_tokens, strict=strict)
    if spec.startswith("self:") or spec == "self":
        n_s = spec.partition(":")[2] or str(max_tokens)
        if not n_s.isdigit() or int(n_s) < 2:
            raise DataError(f"self:N needs an integer N >= 2, got {spec!r}")
        if model is None:
            raise DataError("self:N samples from the model; pass the model")
        n = min(int(n_s), max_tokens)
        if n < min_tokens:
            raise DataError(f"self:{n} is shorter than the {min_tokens} tokens needed")
        return [Document(f"self/{n}/seed{seed + i}", f"self-generated #{i} (seed {seed + i})",
                         sample_self(model, tokenizer, n, seed=seed + i), spec)
                for i in range(docs)]
    if spec == "gutenberg":
        out = _documents(read_gutenberg(), tokenizer, source=spec, **kw)
    elif spec == "pg19" or spec.startswith("pg19:"):
        parts = spec.split(":")[1:]
        repo = parts[0] if parts and parts[0] else pg19_repo
        split = parts[1] if len(parts) > 1 and parts[1] else pg19_split
        out = _documents(read_pg19(repo, split), tokenizer, source=f"pg19:{repo}:{split}", **kw)
    elif Path(spec).expanduser().exists():
        out = _documents(read_local(spec), tokenizer, source=str(Path(spec).expanduser()), **kw)
    else:
        raise DataError(f"unknown data source {spec!r}: use pg19[:REPO[:SPLIT]], gutenberg, "
                        "self:N, or an existing .txt/.parquet/.jsonl file or folder")
    return out
