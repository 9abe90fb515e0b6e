"""``configs --vllm-page``: bytes per request in vLLM's cache, from the plugin's one layout
function (no vLLM needed), and the plugin's config parsing."""

import json
from types import SimpleNamespace

import pytest
import torch

from replayssm_quant.precision import PRESETS, SHAPES
from replayssm_quant.vllm_plugin.layout import ALIGN, extend_page, vllm_page, vllm_page_table
from replayssm_quant.vllm_plugin.settings import ConfigError, settings_for, validate


@pytest.mark.parametrize("shape", list(SHAPES))
def test_table_rows_are_the_layout(shape):
    rows = vllm_page_table(shape, ["ckpt=bf16:sr,read=fp8,L=8"])
    assert [r["name"] for r in rows[:len(PRESETS)]] == list(PRESETS)
    for r in rows:
        page = vllm_page(shape, r["config"])
        assert r["page_bytes"] == page.page_bytes
        assert r["page_bytes"] == sum(r[k] for k in ("conv_bytes", "ckpt_bytes", "read_bytes",
                                                     "ring_bytes", "padding_bytes"))
        assert r["page_bytes"] % ALIGN == 0
    assert rows[0]["vs_stock_fp32"] == 1.0  # conventional FP32 is vLLM's stock page


def test_hand_count_nemotron_super_nvfp4_read():
    """128 heads x 64 x 128, 8 groups, L=16, bf16 activations, conv kernel 4."""
    (row,) = [r for r in vllm_page_table("nemotron-3-super-120b") if r["name"] == "nvfp4-read/fp32"]
    conv = 3 * (128 * 64 + 2 * 8 * 128) * 2
    ckpt = 128 * 64 * 128 * 4
    read = 128 * 64 * (128 // 2 + 4 + 128 // 16)  # nibbles + fp32 row scale + e4m3 blocks
    ring = 128 * 16 * 64 * 2 + 128 * 16 * 4 + 8 * 16 * 128 * 2  # x, dt, B
    assert (row["conv_bytes"], row["ckpt_bytes"], row["read_bytes"], row["ring_bytes"]) == \
        (conv, ckpt, read, ring)
    assert row["page_bytes"] == conv + ckpt + read + ring == 5_181_440


def test_hand_count_qwen_gdn_ring():
    """GDN ring with a read copy: k (bf16), u, g (fp32) and v (bf16), beta (fp32)."""
    (row,) = [r for r in vllm_page_table("qwen3.5-4b") if r["name"] == "nvfp4-read/fp8-sr"]
    hv, hk, K, V, L = 32, 16, 128, 128, 16
    ring = hk * L * K * 2 + hv * L * V * 4 + hv * L * 4 + hv * L * V * 2 + hv * L * 4
    assert row["ring_bytes"] == ring
    assert row["ckpt_bytes"] == hv * V * (K + 4)  # fp8 + row scale


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_pages_shrink(tp):
    one = {r["name"]: r["page_bytes"] for r in vllm_page_table("qwen3.5-122b-a10b")}
    for r in vllm_page_table("qwen3.5-122b-a10b", tp=tp):
        assert r["page_bytes"] * tp == pytest.approx(one[r["name"]], rel=0.02)


def test_offsets_aligned_and_disjoint():
    for shape in SHAPES:
        for cfg in PRESETS.values():
            page = vllm_page(shape, cfg)
            spans = sorted((p.offset, p.offset + p.nbytes) for p in page.parts)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
            tail_start = page.page_bytes - page.tail_bytes
            for p in page.parts:
                assert p.offset % p.dtype.itemsize == 0
                if p.offset >= tail_start:
                    assert p.offset % ALIGN == 0


def test_layout_rejections():
    conv, ssm = (3, 64), (4, 16, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        extend_page("mamba2", "shared-nvfp4", [conv, ssm, (4, 16, 16), (4, 16), (1, 16, 48)],
                    [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32,
                     torch.bfloat16], groups=1, act_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="--use-replayssm"):
        extend_page("mamba2", "replay-fp32", [conv, (4, 16, 32)],
                    [torch.bfloat16, torch.float32], groups=1, act_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="--replayssm-buffer-len"):
        extend_page("mamba2", "replay-fp32",
                    [conv, (4, 16, 32), (4, 8, 16), (4, 8), (1, 8, 32)],
                    [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32,
                     torch.bfloat16], groups=1, act_dtype=torch.bfloat16)


def test_cli_vllm_page_matches_layout():
    from typer.testing import CliRunner

    from replayssm_quant.cli.app import app

    runner = CliRunner()
    if "--vllm-page" not in runner.invoke(app, ["configs", "--help"]).output:
        pytest.skip("configs --vllm-page is not wired into the CLI in this checkout")
    for shape in SHAPES:
        res = runner.invoke(app, ["configs", "--shape", shape, "--vllm-page", "--json"])
        assert res.exit_code == 0, res.output
        got = {r["name"]: r["page_bytes"] for r in json.loads(res.output)}
        assert got == {r["name"]: r["page_bytes"] for r in vllm_page_table(shape)}


# ---------------------------------------------------------------------------------- settings
def _vc(raw, arch="NemotronHForCausalLM", use=True, L=16, **cache):
    c = dict(use_replayssm=use, replayssm_buffer_len=L, enable_prefix_caching=False,
             mamba_cache_mode="none")
    c.update(cache)
    return SimpleNamespace(
        additional_config={} if raw is None else {"replayssm_quant": raw},
        model_config=SimpleNamespace(architecture=arch, hf_text_config=SimpleNamespace(
            ssm_state_size=128, linear_key_head_dim=128)),
        cache_config=SimpleNamespace(**c), speculative_config=None, kv_transfer_config=None,
        mamba_config=SimpleNamespace(backend=SimpleNamespace(name="TRITON"),
                                     enable_stochastic_rounding=False),
        use_v2_model_runner=False)


@pytest.mark.parametrize("raw,use,L,want", [
    ("nvfp4-read/fp32", True, 16, "ckpt=fp32,read=nvfp4,L=16"),
    ("nvfp4-read/fp32", True, 8, "ckpt=fp32,read=nvfp4,L=8"),
    ("ckpt=fp8:sr,read=nvfp4", True, 4, "ckpt=fp8:sr,read=nvfp4,L=4"),
    ("ckpt=fp16:sr,read=nvfp4,L=8", True, 8, "ckpt=fp16:sr,read=nvfp4,L=8"),
    ({"ckpt": "fp16:sr", "read": "fp8"}, True, 16, "ckpt=fp16:sr,read=fp8,L=16"),
    ({"config": "shared-nvfp4", "seed": 5}, True, 16, "ckpt=nvfp4,read=none,L=16"),
    ("fp16-sr", False, 16, "ckpt=fp16:sr,read=none,L=1"),
    ("ckpt=bf16:sr", False, 16, "ckpt=bf16:sr,read=none,L=1"),
])
def test_settings_accepted(raw, use, L, want):
    s = settings_for(_vc(raw, use=use, L=L))
    assert str(s.config) == want and s.kind == "mamba2"
    assert validate(_vc(raw, use=use, L=L)).config == s.config


def test_settings_off():
    assert settings_for(_vc(None)) is None
    assert settings_for(_vc("fp16-sr", arch="Mamba2ForCausalLM", use=False)) is None
    assert validate(_vc(None, use=False)) is None


@pytest.mark.parametrize("raw,kw,message", [
    ("nvfp4-read/fp32", dict(use=False), "add --use-replayssm"),
    ("fp32", {}, "conventional decoding"),
    ("ckpt=fp32,read=nvfp4,L=16", dict(L=8), "L comes from --replayssm-buffer-len"),
    ("nvfp4-read/fp32", dict(L=1), "never replays"),
    ("nvfp4-read/fp32", dict(enable_prefix_caching=True), "--no-enable-prefix-caching"),
    ("nvfp4-read/fp32", dict(mamba_cache_mode="align"), "--no-enable-prefix-caching"),
    ({"config": "fp32", "ckpt": "fp16"}, {}, "not both"),
    ({"seed": -1, "config": "fp16-sr"}, dict(use=False), "seed"),
    (3, {}, "config string or a mapping"),
])
def test_settings_rejected(raw, kw, message):
    with pytest.raises(ConfigError, match=message):
        validate(_vc(raw, **kw))


def test_gdn_replay_flag_needs_the_config():
    with pytest.raises(ConfigError, match="needs their config"):
        validate(_vc(None, arch="Qwen3_5ForCausalLM"))
