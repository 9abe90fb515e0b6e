"""``--device-map``: parsing and validation, the placement a map gives each SSM layer, and every
emulator call and decode step receiving tensors of its own layer's device.

A CPU has one torch device, so placement across GPUs is checked in two honest halves: the pure
logic (a map, or accelerate's ``balanced`` split over two GPUs given their memory, resolves to
the device per SSM layer that the map names), and the run (a model dispatched through the same
path records, for each emulator call and decode step, the layer it serves and the device of
every tensor it gets, which must be the one the map put that layer on; a decoder whose layers
report different devices allocates each replay state on its own layer's device).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import replayssm_quant.kernels as kernels
from replayssm_quant.cli.app import app
from replayssm_quant.models import loading
from replayssm_quant.models.decode import ReplayDecoder, _Session
from replayssm_quant.models.forward import decoder_hidden_states
from replayssm_quant.models.loading import (
    DeviceMapError,
    load_model,
    parse_device_map,
    resolve_device_map,
    ssm_layer_devices,
)
from replayssm_quant.models.patch import patch_model
from replayssm_quant.models.registry import ssm_layers
from replayssm_quant.models.tiny import tiny_model

MODEL_TYPES = ("nemotron_h", "qwen3_5_text")


def _tensor_devices(*args, **kwargs) -> set[torch.device]:
    return {a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}


def _split_map(model: torch.nn.Module, first: int | str, second: int | str) -> dict:
    """Embeddings and the first half of the layers on ``first``, the rest on ``second``."""
    decoder = model.get_decoder()
    prefix = next(n for n, m in model.named_modules() if m is decoder)
    n = len(decoder.layers)
    out = {f"{prefix}.{c}": first for c, _ in decoder.named_children() if c != "layers"}
    out |= {f"{prefix}.layers.{i}": first if i < n // 2 else second for i in range(n)}
    out |= {c: second for c, _ in model.named_children() if c != prefix}
    return out


# ----------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("spec", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_strategies_parse_as_themselves(spec):
    assert parse_device_map(spec) == spec


def test_json_maps_inline_and_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "_cuda_count", lambda: 2)
    text = '{"model.embeddings": 0, "model.layers.0": "cuda:1", "lm_head": "cpu"}'
    want = {"model.embeddings": 0, "model.layers.0": 1, "lm_head": "cpu"}
    assert parse_device_map(text) == want
    path = tmp_path / "map.json"
    path.write_text(text)
    assert parse_device_map(str(path)) == want


@pytest.mark.parametrize("spec, words", [
    ("{not json", "not valid JSON"),
    ("[0, 1]", "non-empty object"),
    ("{}", "non-empty object"),
    ('{"model.layers.0": "tpu"}', "unknown device"),
    ('{"model.layers.0": "meta"}', "only GPU indices"),
    ('{"model.layers.0": 2}', r"GPU 2, but 0 GPU\(s\)"),
    ('{"model.layers.0": true}', "use a GPU index"),
    ("everywhere", "use auto, balanced"),
    ("missing.json", "no such file"),
])
def test_bad_maps_name_the_problem(spec, words, monkeypatch):
    monkeypatch.setattr(loading, "_cuda_count", lambda: 0)
    with pytest.raises(DeviceMapError, match=words):
        parse_device_map(spec)


def test_a_map_must_cover_the_model_and_name_real_modules():
    model, _ = tiny_model("qwen3_5_text")
    full = _split_map(model, "cpu", "cpu")
    assert resolve_device_map(model, full) == full
    with pytest.raises(DeviceMapError, match="does not cover .* e.g. model.layers.3"):
        resolve_device_map(model, {k: v for k, v in full.items() if k != "model.layers.3"})
    with pytest.raises(DeviceMapError, match="does not have: model.layers.9"):
        resolve_device_map(model, full | {"model.layers.9": "cpu"})
    assert resolve_device_map(model, {"": "cpu"}) == {"": "cpu"}


@pytest.mark.parametrize("argv", [
    ["drift", "random:qwen3_5_text", "--device-map", "{oops"],
    ["drift", "random:qwen3_5_text", "--device-map", '{"model.layers.0": "tpu"}'],
    ["drift", "random:qwen3_5_text", "--max-tokens", "16", "--prefill", "4", "--data", "self:16",
     "--configs", "fp32", "--device-map", '{"model.layers.0": "cpu"}'],
    ["eval", "random:qwen3_5_text", "--tasks", "carry_chain", "--device-map", "{oops"],
])
def test_cli_rejects_a_bad_map_in_one_line(argv, tmp_path):
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "device-map" in lines[0]


# ----------------------------------------------------------------------------------- placement
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_each_ssm_layer_gets_the_device_its_map_names(model_type, monkeypatch):
    monkeypatch.setattr(loading, "_cuda_count", lambda: 2)
    model, _ = tiny_model(model_type)
    dmap = parse_device_map(json.dumps(_split_map(model, 0, 1)))
    devices = ssm_layer_devices(model, resolve_device_map(model, dmap))
    n = len(model.get_decoder().layers)
    want = {s.layer: torch.device("cuda", 0 if s.layer < n // 2 else 1) for s in ssm_layers(model)}
    assert devices == want
    assert set(devices.values()) == {torch.device("cuda", 0), torch.device("cuda", 1)}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_balanced_splits_whole_layers_over_two_gpus(model_type):
    model, _ = tiny_model(model_type)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    dmap = resolve_device_map(model, "balanced", max_memory={0: size, 1: size, "cpu": 10 * size})
    assert set(dmap.values()) == {0, 1}
    assert not any(".mixer." in k or ".linear_attn." in k for k in dmap)  # layers stay whole
    devices = ssm_layer_devices(model, dmap)
    assert set(devices.values()) == {torch.device("cuda", 0), torch.device("cuda", 1)}
    for s in ssm_layers(model):
        layer_key = next(k for k in dmap if s.name == k or s.name.startswith(k + "."))
        assert devices[s.layer] == torch.device("cuda", dmap[layer_key])


# ----------------------------------------------------------------------------------- the run
@pytest.fixture
def recorded_emulators(monkeypatch):
    """Every emulator call as ``(kind, layer, devices of its tensor arguments)``."""
    calls: list[tuple[str, int, set[torch.device]]] = []
    for name in ("emulate_mamba2", "emulate_gdn"):
        real = getattr(kernels, name)

        def wrapped(cfg, *args, _real=real, _name=name, layer=0, **kw):
            calls.append((_name, layer, _tensor_devices(*args, **kw)))
            return _real(cfg, *args, layer=layer, **kw)

        monkeypatch.setattr(kernels, name, wrapped)
    return calls


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_emulators_get_their_own_layers_device(model_type, recorded_emulators):
    model, _ = tiny_model(model_type)
    dmap = _split_map(model, "cpu", "cpu")
    mapped, _ = load_model(f"random:{model_type}", device_map=json.dumps(dmap))
    want = ssm_layer_devices(mapped, dmap)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with patch_model(mapped, "shared-fp8", prefill=4):
        h = decoder_hidden_states(mapped, ids)
    assert sorted(layer for _, layer, _ in recorded_emulators) == sorted(want)
    for _, layer, devices in recorded_emulators:
        assert devices == {want[layer]}
    with patch_model(model, "shared-fp8", prefill=4):  # the same numbers as the unmapped model
        assert torch.equal(h, decoder_hidden_states(model, ids))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_decode_steps_get_their_own_layers_device(model_type, monkeypatch):
    mapped, _ = load_model(f"random:{model_type}", device_map='{"": "cpu"}')
    want = ssm_layer_devices(mapped, {"": "cpu"})
    calls: list[tuple[int, set[torch.device]]] = []
    for step in ("mamba2_step", "gdn_step"):
        real = getattr(_Session, step)

        def wrapped(self, layer, *args, _real=real, **kw):
            state = self.states[layer.layer]
            calls.append((layer.layer, _tensor_devices(*args, **kw) | {state.device}))
            return _real(self, layer, *args, **kw)

        monkeypatch.setattr(_Session, step, wrapped)
    out = ReplayDecoder(mapped, "nvfp4-read/fp32").generate([[1, 2, 3], [4, 5]], max_new_tokens=3)
    assert all(len(g.tokens) == 3 for g in out)
    assert {layer for layer, _ in calls} == set(want)
    for layer, devices in calls:
        assert devices == {want[layer]}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_replay_states_are_allocated_on_each_layers_device(model_type):
    """A decoder whose layers sit on different devices gives every replay state its own
    layer's device, not the model's first one (the meta device stands in for a second GPU)."""
    model, _ = tiny_model(model_type)
    decoder = ReplayDecoder(model, "nvfp4-read/fp8-sr")
    layers = sorted(decoder.layer_devices)
    placed = {layer: torch.device("meta" if i % 2 else "cpu") for i, layer in enumerate(layers)}
    decoder.layer_devices = placed
    session = decoder._new_session(2)
    for layer, state in session.states.items():
        assert state.device == placed[layer]
        assert _tensor_devices(*vars(state).values()) <= {placed[layer]}
