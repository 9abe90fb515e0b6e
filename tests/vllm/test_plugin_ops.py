"""vLLM's custom ops (``torch.ops.vllm.mamba_mixer2``, ``torch.ops.vllm.qwen_gdn_attention_core``)
reach the project's kernel entry points with the page's own tensors, and the kernels on the
page views compute what the pure-torch reference computes, config by config."""

import pytest

pytest.importorskip("vllm")

import harness as H  # noqa: E402
import torch  # noqa: E402

from replayssm_quant import formats as F  # noqa: E402
from replayssm_quant.kernels import gdn as gdn_kernels  # noqa: E402
from replayssm_quant.kernels import mamba2 as mamba2_kernels  # noqa: E402
from replayssm_quant.ssm import gdn as gdn_ref  # noqa: E402
from replayssm_quant.ssm import mamba2 as mamba2_ref  # noqa: E402
from replayssm_quant.vllm_plugin import runtime  # noqa: E402

L = 4
NB = 8


@pytest.fixture(autouse=True)
def standins(monkeypatch):
    H.install_cpu_standins(monkeypatch)
    H.CALLS.clear()


class Recorder:
    """Wraps the kernel entry points and the prefill refresh; keeps a reference state in step."""

    def __init__(self, monkeypatch, rig):
        self.rig, self.calls = rig, []
        layer = rig.layer
        self.cache = layer.replayssm_cache
        cfg, s = layer.replayssm_settings.config, layer.replayssm_settings
        d = self.cache.ckpt.data.shape
        dtype = rig.vc.model_config.dtype
        common = dict(layer=layer.replayssm_layer_index, seed=s.seed, act_dtype=dtype)
        if rig.kind == "mamba2":
            self.ref = mamba2_ref.init_mamba2_state(cfg, NB, d[1], d[2], layer.ssm_state_size,
                                                    layer.n_groups, **common)
            self.ref_mod, name, mod = mamba2_ref, "mamba2_decode_step", mamba2_kernels
        else:
            self.ref = gdn_ref.init_gdn_state(cfg, NB, d[1], d[2], layer.head_k_dim,
                                              layer.num_k_heads, **common)
            self.ref_mod, name, mod = gdn_ref, "gdn_decode_step", gdn_kernels
        kernel, refresh = getattr(mod, name), runtime.refresh_after_prefill

        def decode(cache, *args, **kwargs):
            slots = args[-1]
            self.calls.append(("decode", cache, args))
            self.sync()
            y = kernel(cache, *args, **kwargs)
            y_ref = self.ref_mod.decode_step(self.ref, *args[:-1], slots.long())
            keep = slots >= 0
            scale = max(y_ref.abs().max().item(), 1e-6)
            assert (y[keep] - y_ref[keep]).abs().max().item() <= 1e-4 * scale
            return y

        def do_refresh(cache, slots, state):
            self.calls.append(("refresh", cache, (slots, state)))
            refresh(cache, slots, state)
            self.ref_mod.load_state(self.ref, slots.long(), state)

        monkeypatch.setattr(mod, name, decode)
        monkeypatch.setattr(runtime, "refresh_after_prefill", do_refresh)

    def sync(self) -> None:
        """Start the reference step from the page's exact state (as the kernel tests do), so an
        SR boundary that float reduction order moved in an earlier step does not carry over."""
        for st, q in ((self.cache.ckpt, self.ref.ckpt), (self.cache.read, self.ref.read)):
            if st is None:
                continue
            q.data.copy_(st.data)
            for field in ("row_scale", "block_scale"):
                if getattr(st, field) is not None:
                    getattr(q, field).copy_(getattr(st, field))
        for name, t in self.cache.ring.items():
            getattr(self.ref, name).copy_(t)
        self.ref.cursor.copy_(self.cache.cursor)
        self.ref.flush_index.copy_(self.cache.flush_index)

    def check_state(self, blocks):
        """The page's checkpoint and read copy hold what the reference holds."""
        cfg = self.ref.cfg
        idx = torch.tensor(blocks)
        for st, q, fmt in ((self.cache.ckpt, self.ref.ckpt, cfg.ckpt),
                           (self.cache.read, self.ref.read, cfg.read)):
            if st is None:
                continue
            got = runtime.dequantize_checkpoint(
                type(self.cache)(cfg, self.cache.kind, st, None, {}, self.cache.cursor,
                                 self.cache.flush_index, self.cache.nan_count, 0), idx)
            want = F.dequantize(F.QTensor(q.fmt, q.data[idx],
                                          None if q.row_scale is None else q.row_scale[idx],
                                          None if q.block_scale is None else q.block_scale[idx]))
            rowmax = want.abs().amax(-1, keepdim=True).clamp_min(1e-30)
            same = (got - want).abs() <= 1e-5 * rowmax
            assert 1 - same.float().mean().item() < 0.02, f"{fmt.name} state differs"
        assert self.cache.cursor[idx].tolist() == self.ref.cursor[idx].tolist()


CONFIGS = {
    "mamba2": ["nvfp4-read/fp16-sr", "shared-fp8", "fp8-read/fp32", "bf16-sr"],
    "gdn": ["nvfp4-read/fp8-sr", "shared-nvfp4", "fp8-read/fp32", "fp16-sr"],
}


@pytest.mark.parametrize("kind,config", [(k, c) for k, cs in CONFIGS.items() for c in cs])
def test_ops_reach_kernels_and_match_reference(monkeypatch, kind, config):
    rig = H.Rig(kind, config, L=L, num_blocks=NB, seed=hash(config) % 1000)
    rec = Recorder(monkeypatch, rig)
    layer, cache = rig.layer, rig.layer.replayssm_cache
    g = torch.Generator().manual_seed(3)
    # prefill: the op's scan lands in the refresh, with the slots and an fp32 state
    rig.step([(3, 0, 9, 9, True), (1, 0, 6, 6, True)], rig.inputs(15, g))
    (kind0, c0, (slots, state)), = rec.calls
    assert kind0 == "refresh" and c0 is cache and slots.tolist() == [3, 1]
    assert state.dtype == torch.float32 and state.shape[1:] == cache.ckpt.data.shape[1:3] + (
        rec.ref.ckpt.shape[-1],)
    rec.check_state([3, 1])
    n = {3: 9, 1: 6}
    for _ in range(L + 1):
        rec.calls.clear()
        rig.step([(3, n[3], 1, 9, False), (1, n[1], 1, 6, False)], rig.inputs(2, g))
        (kind1, c1, args), = rec.calls
        assert kind1 == "decode" and c1 is cache
        assert args[-1].dtype == torch.int32 and args[-1].tolist() == [3, 1]
        assert all(t.is_contiguous() for t in args[:-1] if isinstance(t, torch.Tensor))
        rec.check_state([3, 1])
        n = {k: v + 1 for k, v in n.items()}
    # mixed batch: decode rows first, then a new prefill
    rec.calls.clear()
    rig.step([(3, n[3], 1, 9, False), (5, 0, 4, 4, True)], rig.inputs(5, g))
    assert sorted(c[0] for c in rec.calls) == ["decode", "refresh"]
    rec.check_state([3, 5])
    # the page's stock views are the kernels' views
    assert cache.ckpt.data.data_ptr() == layer.kv_cache[1].data_ptr()
    vllm_kernels = ("selective_state_update", "sigmoid_gating", "packed_decode")
    assert not any(H.CALLS[k] for k in vllm_kernels), H.CALLS


def test_stock_and_plugin_layers_share_a_process(monkeypatch):
    """The kernel hooks act only for the plugin's layers: a stock layer in the same process
    keeps vLLM's kernels (the stand-ins here)."""
    plugin = H.Rig("gdn", "replay-fp32", L=L)
    stock = H.Rig("gdn", None, weights_from=plugin)
    g = torch.Generator().manual_seed(0)
    inputs = plugin.inputs(1, g)
    for rig in (plugin, stock):
        rig.step([(2, 0, 1, 1, True)], inputs)
    H.CALLS.clear()
    inputs = plugin.inputs(1, g)
    out_p, _ = plugin.step([(2, 1, 1, 1, False)], inputs)
    assert H.CALLS["packed_decode"] == 0
    out_s, _ = stock.step([(2, 1, 1, 1, False)], inputs)
    assert H.CALLS["packed_decode"] == 1
    assert torch.allclose(out_p, out_s, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["mamba2", "gdn"])
def test_padding_rows_touch_nothing(kind):
    """CUDA-graph batches are padded with the null block (index 0): no output, no state."""
    rig = H.Rig(kind, "nvfp4-read/fp16-sr", L=L, num_blocks=NB)
    cache = rig.layer.replayssm_cache
    g = torch.Generator().manual_seed(1)
    rig.step([(3, 0, 5, 5, True), (1, 0, 4, 4, True)], rig.inputs(9, g))
    before = rig.raw.clone()
    cur = cache.cursor.clone()
    idx = torch.tensor([[3], [0], [1], [0]], dtype=torch.int32)
    layer = rig.layer
    if kind == "mamba2":
        H_, P, G, N = layer.num_heads, layer.head_dim, layer.n_groups, layer.ssm_state_size
        y = runtime.mamba2_decode(
            cache, torch.randn(4, H_, P, generator=g), torch.randn(4, H_, generator=g),
            layer.A.float(), torch.randn(4, G, N, generator=g), torch.randn(4, G, N, generator=g),
            layer.D.float(), layer.dt_bias.float(), dt_softplus=True, state_indices=idx)
    else:
        hk, hv, K, V = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        gg, beta = runtime.gdn_gates(layer.A_log, torch.randn(4, hv, generator=g),
                                     layer.dt_bias, torch.randn(4, hv, generator=g))
        y = runtime.gdn_decode(cache, torch.randn(4, hk, K, generator=g),
                               torch.randn(4, hk, K, generator=g),
                               torch.randn(4, hv, V, generator=g), gg, beta,
                               state_indices=idx.view(-1), scale=K ** -0.5, normalize=True,
                               valid_rows=3)
    assert y[1].abs().max() == 0 and y[3].abs().max() == 0 and y[0].abs().max() > 0
    assert cache.cursor.tolist() == [c + (1 if i in (1, 3) else 0) for i, c in
                                     enumerate(cur.tolist())]
    changed = (rig.raw != before).reshape(NB, -1).any(-1)
    assert changed.tolist() == [i in (1, 3) for i in range(NB)]
