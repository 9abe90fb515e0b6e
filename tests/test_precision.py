"""PrecisionConfig parsing, presets, validation, and the state-bytes cost model."""

import json

import pytest
from typer.testing import CliRunner

from replayssm_quant.cli.app import app
from replayssm_quant.precision import (
    PRESETS,
    ModelShape,
    parse_config,
    resolve_shape,
    step_bytes,
)


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_round_trip(name):
    cfg = PRESETS[name]
    again = parse_config(str(cfg))
    assert again == cfg and str(again) == str(cfg)
    assert again.label == name  # a string equal to a preset resolves to its name


@pytest.mark.parametrize("text", [
    "ckpt=fp16:sr,read=nvfp4,L=16", "ckpt=fp8:sr,read=nvfp4,L=8", "ckpt=bf16,read=fp8,L=4",
    "ckpt=fp32,read=none,L=32", "ckpt=nvfp4:sr,read=none,L=2",
])
def test_strings_round_trip(text):
    assert str(parse_config(text)) == text


def test_spellings_normalise():
    assert str(parse_config(" CKPT=fp8e4m3:SR , read=NVFP4 , l=16 ")) == "ckpt=fp8:sr,read=nvfp4,L=16"


@pytest.mark.parametrize("text,msg", [
    ("", "empty precision config"),
    ("fancy", "unknown preset 'fancy'"),
    ("ckpt=fp7,L=4", "unknown number format 'fp7'"),
    ("ckpt=fp32,read=nvfp4,L=0", "L must be >= 1"),
    ("ckpt=fp32,read=nvfp4,L=x", "L must be an integer"),
    ("ckpt=fp32,read=nvfp4,L=1", "a read copy needs L > 1"),
    ("ckpt=fp16:up,L=4", "unknown rounding 'up'"),
    ("ckpt=fp32:sr,L=4", "ckpt=fp32:sr makes no sense"),
    ("ckpt=fp32,read=nvfp4:sr,L=4", "read copies are always rounded to nearest"),
    ("ckpt=fp32,colour=red", "unknown key 'colour'"),
    ("ckpt=fp32,ckpt=fp16", "given twice"),
    ("read=nvfp4,L=4", "has no ckpt"),
    ("ckpt=fp32,,L=4", "empty field"),
    ("ckpt=fp8e5m2,L=4", "checkpoint format 'fp8e5m2' is not supported"),
    ("ckpt=fp32,read=fp32,L=4", "duplicates the checkpoint"),
    ("ckpt=fp32,L=999", "L must be <= 256"),
])
def test_bad_configs(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_config(text)


def test_shape_validation():
    with pytest.raises(ValueError, match="multiple of groups"):
        ModelShape("x", "mamba2", 10, 64, 128, 3)
    with pytest.raises(ValueError, match="kind must be"):
        ModelShape("x", "rwkv", 8, 64, 128, 2)
    with pytest.raises(ValueError, match="unknown shape"):
        resolve_shape("llama")


def test_hand_count_nemotron_super():
    """Nemotron-3-Super Mamba-2 layer, bf16 activations, L = 16, by hand."""
    H, P, N, G = 128, 64, 128, 8
    S = H * P * N * 4  # fp32 state: 4 MiB
    conv = 2 * S  # read + write every step
    rec = H * P * 2 + H * 4 + G * N * 2  # x bf16, dt fp32, B bf16
    L = 16
    # 15 non-flush steps read S and k-1 records and write one; the flush reads S and 15
    # records and writes S.
    replay = (15 * S + sum(range(15)) * rec + 15 * rec + S + 15 * rec + S) / L
    shape = resolve_shape("nemotron-3-super")
    assert step_bytes(PRESETS["fp32"], shape).window_average == conv
    got = step_bytes(PRESETS["replay-fp32"], shape).window_average
    assert got == pytest.approx(replay)
    assert got / conv == pytest.approx(0.5503, abs=1e-4)  # ~0.53 of pure state + the ring
    # NVFP4 read copy (per 128-row: 64 B codes + 8 B block scales + 4 B row scale)
    rd = H * P * (64 + 8 + 4)
    ck16 = H * P * N * 2
    nv = (15 * rd + sum(range(15)) * rec + 15 * rec + ck16 + 15 * rec + ck16 + rd) / L
    assert step_bytes(PRESETS["nvfp4-read/fp16-sr"], shape).window_average == pytest.approx(nv)


def test_cli_configs_json_and_table():
    r = CliRunner().invoke(app, ["configs", "--shape", "nemotron-3-super", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["fp32"]["traffic_vs_fp32"] == 1.0
    assert rows["replay-fp32"]["traffic_vs_fp32"] == pytest.approx(0.55, abs=0.03)
    r = CliRunner().invoke(app, ["configs", "--shape", "qwen3.5-4b", "-c", "ckpt=bf16:sr,read=fp8,L=8"])
    assert r.exit_code == 0 and "ckpt=bf16:sr,read=fp8,L=8" in r.output
    r = CliRunner().invoke(app, ["configs", "--shape", "nope"])
    assert r.exit_code == 2 and "unknown shape" in r.output


def test_command_list_joins_wrapped_docstrings():
    """The root --help lists each command's first paragraph as one wrapped text: a
    docstring's own line breaks would otherwise cut lines mid-sentence in the list."""
    names = [info.name for info in app.registered_commands]
    assert {"configs", "plan", "drift", "eval", "recommend", "report", "gate"} <= set(names)
    for info in app.registered_commands:
        for para in info.help.split("\n\n"):
            assert "\n" not in para, info.name
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    line = next(ln for ln in r.output.splitlines() if "(one layer, one" in ln)
    assert "(one layer, one sequence)" in line
