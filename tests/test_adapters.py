"""Model adapters: the fp32 preset reproduces the unpatched model for every supported
architecture, the decode emulation really runs after the prefill, and the model is restored."""

from __future__ import annotations

import importlib

import pytest
import torch

from replayssm_quant import kernels
from replayssm_quant.evals.decay import DecayRecorder
from replayssm_quant.models import patch
from replayssm_quant.models.fixture import FIXTURES, fixture, fixture_path
from replayssm_quant.models.forward import decoder_hidden_states, lm_head_logits
from replayssm_quant.models.patch import patch_model
from replayssm_quant.models.registry import (
    ARCHITECTURES,
    UnsupportedArchitecture,
    model_shape,
    ssm_layers,
)
from replayssm_quant.models.tiny import tiny_model

TYPES = sorted(ARCHITECTURES)
T = 96
PREFILL = 37


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=TYPES)
def tiny(request):
    model, tok = tiny_model(request.param)
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(1))
    return request.param, model, ids


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _assert_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> None:
    err = float((a - b).abs().max() / b.abs().max())
    assert err <= rel, f"max relative error {err:.3g} > {rel}"


@pytest.mark.parametrize("prefill", [0, PREFILL])
def test_fp32_matches_unpatched(tiny, prefill):
    _, model, ids = tiny
    ref = _logits(model, ids)
    with patch_model(model, "fp32", prefill=prefill):
        out = _logits(model, ids)
    _assert_close(out, ref)


def test_prefill_longer_than_sequence_is_the_model_itself(tiny):
    _, model, ids = tiny
    ref = _logits(model, ids)
    with patch_model(model, "shared-nvfp4", prefill=10_000):
        assert torch.equal(_logits(model, ids), ref)


def test_narrow_config_changes_only_decoded_positions(tiny):
    _, model, ids = tiny
    ref = _logits(model, ids)
    with patch_model(model, "shared-nvfp4", prefill=PREFILL):
        out = _logits(model, ids)
    torch.testing.assert_close(out[:, :PREFILL], ref[:, :PREFILL], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[:, PREFILL:], ref[:, PREFILL:], rtol=0, atol=1e-7)


def test_emulation_called_per_layer_after_prefill(tiny, monkeypatch):
    kind_name, model, ids = tiny
    kind = ARCHITECTURES[kind_name].kind
    calls = []
    name = "emulate_mamba2" if kind == "mamba2" else "emulate_gdn"
    real = getattr(kernels, name)

    def spy(cfg, S0, *args, layer, seed, **kw):
        calls.append((cfg.label, layer, seed, args[0].shape, None if S0 is None else S0.shape))
        return real(cfg, S0, *args, layer=layer, seed=seed, **kw)

    monkeypatch.setattr(kernels, name, spy)
    with patch_model(model, "nvfp4-read/fp32", prefill=PREFILL, seed=7):
        _logits(model, ids)
    layers = ssm_layers(model)
    assert [c[1] for c in calls] == [s.layer for s in layers]
    for (label, _, seed, shape, s0), s in zip(calls, layers, strict=True):
        assert label == "nvfp4-read/fp32" and seed == 7
        assert shape[1] == T - PREFILL
        if kind == "mamba2":
            assert s0 == (1, s.heads, s.head_dim, s.d_state)
            assert shape[2:] == (s.heads, s.head_dim)
        else:  # q arrives with the real key heads, S0 as (B, Hv, V, K)
            assert s0 == (1, s.heads, s.head_dim, s.d_state)
            assert shape[2:] == (s.groups, s.d_state)


def test_patch_restores_model(tiny):
    kind_name, model, ids = tiny
    arch = ARCHITECTURES[kind_name]
    mod = importlib.import_module(arch.module)
    before = getattr(mod, arch.scan)
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in
             (s.module for s in ssm_layers(model))]
    with patch_model(model, "shared-fp8", prefill=PREFILL):
        assert getattr(mod, arch.scan) is not before
        with patch_model(model, "fp32", prefill=PREFILL):  # nested patches share the install
            pass
        assert getattr(mod, arch.scan) is not before
    assert getattr(mod, arch.scan) is before
    assert hooks == [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in
                     (s.module for s in ssm_layers(model))]


def test_patch_restores_after_error(tiny, monkeypatch):
    kind_name, model, ids = tiny
    arch = ARCHITECTURES[kind_name]
    mod = importlib.import_module(arch.module)
    before = getattr(mod, arch.scan)

    def boom(*a, **k):
        raise RuntimeError("emulator failed")

    monkeypatch.setattr(kernels, "emulate_mamba2", boom)
    monkeypatch.setattr(kernels, "emulate_gdn", boom)
    with pytest.raises(RuntimeError, match="emulator failed"):
        with patch_model(model, "shared-fp8", prefill=PREFILL):
            _logits(model, ids)
    assert getattr(mod, arch.scan) is before
    assert patch._ACTIVE.get() is None


def test_hidden_states_and_head_compose_to_logits(tiny):
    _, model, ids = tiny
    with torch.no_grad():
        logits = lm_head_logits(model, decoder_hidden_states(model, ids))
    torch.testing.assert_close(logits, _logits(model, ids).float())


def test_shapes_and_decay(tiny):
    kind_name, model, ids = tiny
    layers = ssm_layers(model)
    shape = model_shape(model, "tiny")
    assert shape.kind == ARCHITECTURES[kind_name].kind and shape.layers == len(layers)
    assert (shape.heads, shape.head_dim, shape.d_state, shape.groups) == (
        layers[0].heads, layers[0].head_dim, layers[0].d_state, layers[0].groups)
    rec = DecayRecorder()
    with patch_model(model, "fp32", prefill=10_000, decay=rec):
        _logits(model, ids)
    spec = rec.spectrum()
    assert [lay["layer"] for lay in spec["layers"]] == [s.layer for s in layers]
    assert all(lay["tokens"] == T for lay in spec["layers"])
    for lay, s in zip(spec["layers"], layers, strict=True):
        assert len(lay["mean_decay"]) == s.heads
        assert all(0.0 < d < 1.0 for d in lay["mean_decay"])
    again = DecayRecorder.from_state_dict(rec.state_dict())
    assert again.spectrum() == spec


def test_decay_recorder_values():
    rec = DecayRecorder()
    rec.add(3, "gdn", torch.tensor([[[0.5, 0.995], [0.7, 0.999]]]))
    other = DecayRecorder()
    other.add(3, "gdn", torch.tensor([[[0.6, 0.999]]]))
    rec.merge(other)
    sp = rec.spectrum()
    (lay,) = sp["layers"]
    assert lay["tokens"] == 3
    assert lay["mean_decay"] == pytest.approx([0.6, (0.995 + 0.999 + 0.999) / 3])
    assert lay["geomean_decay"][0] == pytest.approx((0.5 * 0.7 * 0.6) ** (1 / 3))
    assert sp["fraction_of_heads"][">=0.99"] == pytest.approx(0.5)
    assert sp["fraction_of_heads"][">=0.999"] == 0.0


def test_unsupported_architecture_names_the_supported_ones():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(UnsupportedArchitecture) as e:
        patch_model(model, "fp32", prefill=0)
    msg = str(e.value)
    assert "'llama'" in msg and "nemotron_h" in msg and "qwen3_5" in msg and "\n" not in msg
    with pytest.raises(UnsupportedArchitecture):
        tiny_model("llama")


def test_cached_decode_refuses(tiny):
    _, model, ids = tiny
    with torch.no_grad(), patch_model(model, "fp32", prefill=4):
        out = model(ids[:, :8], use_cache=True)
        cache = getattr(out, "past_key_values", None)
        kw = {"past_key_values": cache} if cache is not None else {
            "cache_params": out.cache_params}
        with pytest.raises(RuntimeError, match="use_cache=False"):
            model(ids[:, 8:9], use_cache=True, **kw)


def _fixture_or_skip(name: str):
    try:
        fixture_path(name)
    except FileNotFoundError:
        pytest.skip(f"fixture {name} not built")
    return fixture(name)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_fp32_matches_unpatched(name):
    model, tok = _fixture_or_skip(name)
    text = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar. " * 4
    ids = torch.tensor([tok(text)["input_ids"]])
    ref = _logits(model, ids)
    with patch_model(model, "fp32", prefill=ids.shape[1] // 3):
        out = _logits(model, ids)
    _assert_close(out, ref)
    with patch_model(model, "shared-nvfp4", prefill=ids.shape[1] // 3):
        assert not torch.allclose(_logits(model, ids), ref, rtol=0, atol=1e-6)
