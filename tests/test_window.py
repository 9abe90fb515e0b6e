"""Sliding-window attention for NemotronH and Qwen3.5 (``models/window.py``): the band it
applies, that a windowed model's cached decode matches its full forward, padding, and loading
from a folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from replayssm_quant.models import fixture, fixture_path
from replayssm_quant.models.loading import load_model
from replayssm_quant.models.window import (
    WINDOW_ATTENTION,
    apply_attention_window,
    attention_window,
    band_mask,
)

MODELS = ("nemotron-h-tiny", "qwen3.5-tiny")


@pytest.fixture(scope="module", params=MODELS)
def model_tok(request):
    """A fixture switched to full attention (each test sets the window it needs)."""
    torch.manual_seed(0)
    model, tok = fixture(request.param)
    model.config.sliding_window = None
    model.set_attn_implementation("sdpa")
    return model, tok


def test_band_mask_counts_keys_back_from_each_query():
    m = band_mask(3, 7, 2, "cpu")  # queries are keys 4, 5, 6
    expected = torch.tensor([[0, 0, 0, 1, 1, 0, 0],
                             [0, 0, 0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    assert torch.equal(band_mask(4, 4, 100, "cpu"), torch.ones(4, 4).tril().bool())


def _eager_windowed_logits(model, ids: torch.Tensor, window: int) -> torch.Tensor:
    """Reference: the same model in eager attention with the band passed as a 4D mask."""
    t = ids.shape[1]
    band = band_mask(t, t, window, "cpu")
    mask = torch.where(band, 0.0, torch.finfo(torch.float32).min)[None, None].expand(ids.shape[0], 1, t, t)
    model.set_attn_implementation("eager")
    try:
        return model(ids, attention_mask=mask).logits
    finally:
        model.set_attn_implementation("sdpa")


def test_windowed_forward_matches_eager_band_and_decode(model_tok):
    model, _ = model_tok
    ids = torch.randint(3, 1000, (2, 48))
    with torch.no_grad():
        full = model(ids).logits
        ref = _eager_windowed_logits(model, ids, 8)
        model.config.sliding_window = 8
        apply_attention_window(model)
        try:
            assert model.config._attn_implementation == WINDOW_ATTENTION
            win = model(ids).logits
            # decode token by token from a 30-token prefill: the band also applies to the cache
            out = model(ids[:, :30], use_cache=True)
            cache, steps = out.past_key_values, [out.logits[:, -1]]
            for t in range(30, 47):
                out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                steps.append(out.logits[:, -1])
        finally:
            model.config.sliding_window = None
            model.set_attn_implementation("sdpa")
    assert torch.allclose(win, ref, atol=1e-4), (win - ref).abs().max()
    # within the window nothing changes; beyond it the logits do
    assert torch.allclose(win[:, :8], full[:, :8], atol=1e-5)
    assert (win[:, 20:] - full[:, 20:]).abs().max() > 1e-2
    # the cached decode agrees with the chunked forward as closely as the full-attention model's does
    assert (torch.stack(steps, 1) - win[:, 29:47]).abs().max() < 0.1


def test_left_padded_batch_has_no_nan_and_matches_unpadded(model_tok):
    model, _ = model_tok
    ids = torch.randint(3, 1000, (1, 24))
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
    attn = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 24, dtype=torch.long)], 1)
    model.config.sliding_window = 6
    apply_attention_window(model)
    try:
        with torch.no_grad():
            alone = model(ids).logits
            both = model(padded, attention_mask=attn).logits
    finally:
        model.config.sliding_window = None
        model.set_attn_implementation("sdpa")
    assert torch.isfinite(both).all()
    assert torch.allclose(both[:, 5:], alone, atol=1e-3), (both[:, 5:] - alone).abs().max()


@pytest.mark.parametrize("name", MODELS)
def test_folder_with_window_loads_windowed(tmp_path, name):
    """The shipped fixtures carry their 16-token window; a copy without the field loads with
    full attention, one with another window with that one."""
    shipped, _ = fixture(name)
    assert attention_window(shipped.config) == 16
    assert shipped.config._attn_implementation == WINDOW_ATTENTION
    src = fixture_path(name)
    for window in (None, 32):
        dst = tmp_path / f"w{window}"
        shutil.copytree(src, dst)
        config = json.loads((dst / "config.json").read_text())
        config["sliding_window"] = window
        (dst / "config.json").write_text(json.dumps(config))
        model, _ = load_model(str(dst))
        assert attention_window(model.config) == window
        assert (model.config._attn_implementation == WINDOW_ATTENTION) == (window is not None)
