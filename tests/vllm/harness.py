"""Shared helpers for the vLLM plugin tests (CPU, ``VLLM_TARGET_DEVICE=cpu``).

Tiny model configs for the seven architectures, engine configs with ``load_format="dummy"``, a
one-process distributed setup so layers can be built, metadata batches for the real vLLM
metadata builders, and pure-torch stand-ins for the vLLM kernels this CPU wheel lacks (its C++
CPU ops are not built; its Triton kernels need a GPU). The stand-ins implement the plain
recurrences, so a stock layer running them is the FP32 oracle the plugin's layers are compared
with.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")

MAMBA2 = dict(hidden_size=128, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
              ssm_state_size=32, conv_kernel=4, chunk_size=16)
GDN = dict(hidden_size=128, linear_num_key_heads=4, linear_num_value_heads=8,
           linear_key_head_dim=32, linear_value_head_dim=16, linear_conv_kernel_dim=4)
ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
            max_position_embeddings=512)


def _text_gdn(n_layers: int = 4, over: dict | None = None, **extra) -> dict:
    return dict({**GDN, **ATTN, **(over or {})}, num_hidden_layers=n_layers,
                intermediate_size=128,
                layer_types=["linear_attention", "linear_attention", "linear_attention",
                             "full_attention"][:n_layers], **extra)


def _config(arch: str, overrides: tuple = ()):
    import transformers as T

    over = dict(overrides)
    if arch in ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"):
        return T.NemotronHConfig(hybrid_override_pattern="M*M-", intermediate_size=256,
                                 architectures=[arch], **{**MAMBA2, **ATTN, **over})
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
               shared_expert_intermediate_size=64)
    if arch == "Qwen3NextForCausalLM":
        return T.Qwen3NextConfig(architectures=[arch], **_text_gdn(over=over, **moe))
    if arch == "Qwen3_5ForCausalLM":
        return T.Qwen3_5TextConfig(architectures=[arch], **_text_gdn(over=over))
    if arch == "Qwen3_5MoeForCausalLM":
        return T.Qwen3_5MoeTextConfig(architectures=[arch], **_text_gdn(over=over, **moe))
    vision = dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2,
                  out_hidden_size=128)
    if arch == "Qwen3_5ForConditionalGeneration":
        return T.Qwen3_5Config(architectures=[arch], text_config=_text_gdn(over=over),
                               vision_config=vision)
    if arch == "Qwen3_5MoeForConditionalGeneration":
        return T.Qwen3_5MoeConfig(architectures=[arch],
                                  text_config=_text_gdn(over=over, **moe),
                                  vision_config=vision)
    if arch == "Mamba2ForCausalLM":
        return T.Mamba2Config(architectures=[arch], hidden_size=128, num_heads=8, head_dim=32,
                              n_groups=2, state_size=32, num_hidden_layers=2, vocab_size=512,
                              expand=2, conv_kernel=4, chunk_size=16)
    raise KeyError(arch)


@functools.cache
def model_dir(arch: str, dtype: str = "bfloat16", overrides: tuple = ()) -> str:
    """A directory holding only ``config.json`` for a tiny model of ``arch`` (``overrides``:
    ``((field, value), ...)`` on the SSM/attention fields)."""
    d = Path(tempfile.mkdtemp(prefix=f"rq-{arch}-"))
    cfg = _config(arch, overrides)
    cfg.save_pretrained(d)
    data = json.loads((d / "config.json").read_text())
    data["torch_dtype"] = dtype
    data["dtype"] = dtype
    (d / "config.json").write_text(json.dumps(data))
    return str(d)


def engine_config(arch: str, *, dtype: str = "bfloat16", overrides: tuple = (), **kwargs):
    """``EngineArgs(...).create_engine_config()`` for a tiny ``arch`` with dummy weights."""
    from vllm.engine.arg_utils import EngineArgs

    args = dict(model=model_dir(arch, dtype, tuple(overrides)), load_format="dummy",
                skip_tokenizer_init=True,
                max_model_len=256, enable_prefix_caching=False, dtype=dtype,
                max_num_seqs=8)
    args.update(kwargs)
    return EngineArgs(**args).create_engine_config()


def inspect_models_in_process() -> None:
    """vLLM inspects lazily registered model classes in a subprocess (to keep CUDA out of the
    front end), one ~40 s Python start per class on these machines; on a CPU-only test run the
    same inspection can run in-process."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


_DIST = False


def distributed(vllm_config) -> None:
    """A one-process gloo 'TP group' so vLLM layers can be built (once per process)."""
    global _DIST
    if _DIST:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.utils.network_utils import get_open_port

    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}",
                                     backend="gloo")
        initialize_model_parallel(1, 1)
    _DIST = True


def common_metadata(reqs: list[tuple[int, int, int, int, bool]]):
    """``CommonAttentionMetadata`` for requests ``(block, num_computed, query_len, decode_base,
    is_prefilling)``, decode rows first (vLLM's order)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    ql = torch.tensor([r[2] for r in reqs], dtype=torch.int32)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(ql, 0)
    sl = torch.tensor([r[1] + r[2] for r in reqs], dtype=torch.int32)
    n = int(ql.sum())
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=sl,
        num_reqs=len(reqs), num_actual_tokens=n, max_query_len=int(ql.max()),
        max_seq_len=int(sl.max()),
        block_table_tensor=torch.tensor([[r[0]] for r in reqs], dtype=torch.int32),
        slot_mapping=torch.zeros(n, dtype=torch.int64),
        is_prefilling=torch.tensor([r[4] for r in reqs]),
        seq_lens_cpu_upper_bound=sl.clone(),
        replayssm_decode_base_cpu=torch.tensor([r[3] for r in reqs], dtype=torch.int32))


# ---------------------------------------------------------------------------------- stand-ins
CALLS: Counter = Counter()
"""How often each stand-in ran (a plugin layer's decode rows must never reach them)."""

def _mamba_chunk_scan_fwd(out, final_states, x, dt, A, B, C, D, z, cu_seqlens):
    """Sequential Mamba-2 scan (vLLM's C++ CPU op ``mamba_chunk_scan_fwd_cpu``)."""
    CALLS["chunk_scan"] += 1
    rep = x.shape[1] // B.shape[1]
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        S = final_states[b].float()
        for t in range(cu[b], cu[b + 1]):
            d = dt[t].float()
            Bt = B[t].float().repeat_interleave(rep, 0)
            Ct = C[t].float().repeat_interleave(rep, 0)
            S = torch.exp(d * A.float())[:, None, None] * S \
                + (d[:, None] * x[t].float())[:, :, None] * Bt[:, None, :]
            y = (S * Ct[:, None, :]).sum(-1)
            if D is not None:
                y = y + D.float()[:, None] * x[t].float()
            out[t] = y.to(out.dtype)
        final_states[b] = S


def _selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, sbi, dsbi,
                            null_block_id, out, num_accepted_tokens, cu_seqlens):
    """One Mamba-2 decode step per row (vLLM's C++ CPU op ``selective_state_update_cpu``)."""
    CALLS["selective_state_update"] += 1
    rows = x.shape[0]
    rep = x.shape[1] // B.shape[1]
    for i in range(rows):
        idx = int(sbi.reshape(rows, -1)[i, 0])
        if idx == null_block_id:
            continue
        d = dt[i].float() + (dt_bias.float() if dt_bias is not None else 0.0)
        if dt_softplus:
            d = F.softplus(d)
        Bt = B[i].float().repeat_interleave(rep, 0)
        Ct = C[i].float().repeat_interleave(rep, 0)
        S = torch.exp(d[..., None] * A.float()) * state[idx].float() \
            + (d * x[i].float())[..., None] * Bt[:, None, :]
        y = (S * Ct[:, None, :]).sum(-1)
        if D is not None:
            y = y + D.float() * x[i].float()
        out[i] = y.to(out.dtype)
        dst = int(dsbi.reshape(rows, -1)[i, 0]) if dsbi is not None else idx
        state[dst] = S.to(state.dtype)


def _conv_update(x, conv_state, weight, bias, activation, conv_state_indices, query_start_loc,
                 pad_slot_id):
    """Causal conv1d decode update (vLLM's C++ CPU op ``causal_conv1d_update_cpu_vec``)."""
    out = torch.zeros_like(x)
    idx = conv_state_indices.reshape(x.shape[0], -1)[:, 0]
    for i in range(x.shape[0]):
        s = int(idx[i])
        if s == pad_slot_id:
            continue
        xn = torch.cat([conv_state[s].float(), x[i].float()[:, None]], -1)
        y = (xn * weight.float()).sum(-1)
        if bias is not None:
            y = y + bias.float()
        if activation in ("silu", "swish", True):
            y = F.silu(y)
        out[i] = y.to(out.dtype)
        conv_state[s] = xn[:, 1:].to(conv_state.dtype)
    return out


def _l2(t):
    t = t.float()
    return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)


def _gates(A_log, a, dt_bias, b):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _gdn_step(S, q, k, v, g, beta):
    """One GDN token for all value heads: S (Hv, V, K), q/k (Hv, K), v (Hv, V)."""
    S = torch.exp(g)[:, None, None] * S
    u = beta[:, None] * (v - (S * k[:, None, :]).sum(-1))
    S = S + u[:, :, None] * k[:, None, :]
    return S, (S * q[:, None, :]).sum(-1)


def post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim,
                   apply_l2norm=True, output_g_exp=False):
    """``fused_post_conv_prep`` (FLA Triton) in torch."""
    L = conv_output.shape[0]
    hk, K, V = num_k_heads, head_k_dim, head_v_dim
    hv = A_log.shape[0]
    q, k, v = torch.split(conv_output, [hk * K, hk * K, hv * V], -1)
    q, k = q.reshape(L, hk, K), k.reshape(L, hk, K)
    if apply_l2norm:
        q, k = _l2(q).to(conv_output.dtype), _l2(k).to(conv_output.dtype)
    g, beta = _gates(A_log, a, dt_bias, b)
    return (q.contiguous(), k.contiguous(), v.reshape(L, hv, V).contiguous(),
            torch.exp(g) if output_g_exp else g, beta)


class ChunkGatedDeltaRule(torch.nn.Module):
    """``chunk_gated_delta_rule`` (FLA Triton) as a token loop."""

    gdn_prefill_backend = "triton"

    def forward(self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                use_qk_l2norm_in_kernel=False, **_):
        CALLS["chunk_gated_delta_rule"] += 1
        hv, K = v.shape[2], q.shape[-1]
        rep = hv // q.shape[2]
        cu = cu_seqlens.tolist()
        o = torch.zeros(1, q.shape[1], hv, v.shape[-1], dtype=v.dtype)
        final = torch.zeros(len(cu) - 1, *initial_state.shape[1:], dtype=torch.float32)
        for n in range(len(cu) - 1):
            S = initial_state[n].float()
            for t in range(cu[n], cu[n + 1]):
                qt, kt = q[0, t].float(), k[0, t].float()
                if use_qk_l2norm_in_kernel:
                    qt, kt = _l2(qt), _l2(kt)
                S, ot = _gdn_step(S, (qt * K ** -0.5).repeat_interleave(rep, 0),
                                  kt.repeat_interleave(rep, 0), v[0, t].float(),
                                  g[0, t].float(), beta[0, t].float())
                o[0, t] = ot.to(o.dtype)
            final[n] = S
        return o, final


def sigmoid_gating_update(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                          initial_state=None, inplace_final_state=True, cu_seqlens=None,
                          ssm_state_indices=None, num_accepted_tokens=None,
                          use_qk_l2norm_in_kernel=False, is_kda=False):
    """``fused_sigmoid_gating_delta_rule_update`` (FLA Triton), one token per sequence."""
    CALLS["sigmoid_gating"] += 1
    T, hv, K = q.shape[1], v.shape[2], q.shape[-1]
    rep = hv // q.shape[2]
    scale = scale or K ** -0.5
    g, bt = _gates(A_log, a, dt_bias, b)
    o = torch.zeros(1, T, hv, v.shape[-1], dtype=q.dtype)
    for t in range(T):
        idx = int(ssm_state_indices[t])
        if idx <= 0:
            continue
        qt, kt = q[0, t].float(), k[0, t].float()
        if use_qk_l2norm_in_kernel:
            qt, kt = _l2(qt), _l2(kt)
        S, ot = _gdn_step(initial_state[idx].float(), (qt * scale).repeat_interleave(rep, 0),
                          kt.repeat_interleave(rep, 0), v[0, t].float(), g[t], bt[t])
        initial_state[idx] = S.to(initial_state.dtype)
        o[0, t] = ot.to(o.dtype)
    return o, initial_state


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                  ssm_state_indices, use_qk_l2norm_in_kernel=False):
    """``fused_recurrent_gated_delta_rule_packed_decode`` (FLA Triton)."""
    CALLS["packed_decode"] += 1
    CALLS["sigmoid_gating"] -= 1
    hv, V, K = initial_state.shape[1:]
    hk = (mixed_qkv.shape[1] - hv * V) // (2 * K)
    q, k, v = torch.split(mixed_qkv, [hk * K, hk * K, hv * V], -1)
    o, _ = sigmoid_gating_update(A_log, a, b, dt_bias, q.reshape(1, -1, hk, K),
                                 k.reshape(1, -1, hk, K), v.reshape(1, -1, hv, V), scale=scale,
                                 initial_state=initial_state, ssm_state_indices=ssm_state_indices,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    out.copy_(o[0].unsqueeze(1))
    return out, initial_state


def install_cpu_standins(monkeypatch) -> None:
    """Put the stand-ins where vLLM (and the plugin's passthrough) will call them."""
    import vllm._custom_ops as ops
    import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as qg
    import vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d as cc

    import replayssm_quant.vllm_plugin.gdn  # noqa: F401  (wrap the kernel globals first)
    import replayssm_quant.vllm_plugin.mamba2  # noqa: F401
    from replayssm_quant.vllm_plugin import hooks

    monkeypatch.setattr(ops, "mamba_chunk_scan_fwd_cpu", _mamba_chunk_scan_fwd, raising=False)
    monkeypatch.setattr(ops, "selective_state_update_cpu", _selective_state_update,
                        raising=False)
    monkeypatch.setattr(cc, "causal_conv1d_update_cpu_vec", _conv_update)
    monkeypatch.setattr(qg, "fused_post_conv_prep", post_conv_prep)
    for name, fake in (("fused_sigmoid_gating_delta_rule_update", sigmoid_gating_update),
                       ("fused_recurrent_gated_delta_rule_packed_decode", packed_decode)):
        current = getattr(qg, name)
        if hasattr(current, hooks._MARK):
            monkeypatch.setattr(current, hooks._MARK, fake)
        else:
            monkeypatch.setattr(qg, name, fake)


def use_torch_chunk(layer) -> None:
    """Give a GDN layer the token-loop prefill (inside the plugin's refresh wrapper if any)."""
    from replayssm_quant.vllm_plugin.hooks import GDNPrefillRefresh

    if isinstance(layer.chunk_gated_delta_rule, GDNPrefillRefresh):
        layer.chunk_gated_delta_rule.inner = ChunkGatedDeltaRule()
    else:
        layer.chunk_gated_delta_rule = ChunkGatedDeltaRule()


# ---------------------------------------------------------------------------------- layer rigs
def _replays(config: str) -> bool:
    from replayssm_quant.precision import parse_config

    try:
        return parse_config(config).L > 1
    except ValueError:  # a read copy without L: replays with --replayssm-buffer-len
        return True


class Rig:
    """One real vLLM layer (the plugin's class, enabled or not) bound to ``num_blocks`` pages,
    with vLLM's own metadata builder, driven through vLLM's custom op."""

    _n = 0

    def __init__(self, kind: str, config: str | None, *, L: int = 4, dtype: str = "float32",
                 num_blocks: int = 8, weights_from: Rig | None = None, seed: int = 0) -> None:
        from vllm.config import set_current_vllm_config

        Rig._n += 1
        self.kind = kind
        arch = "NemotronHForCausalLM" if kind == "mamba2" else "Qwen3_5ForCausalLM"
        replay = config is not None and _replays(config)
        extra = {} if config is None else {"replayssm_quant": config}
        self.vc = engine_config(arch, dtype=dtype, use_replayssm=replay,
                                replayssm_buffer_len=L, additional_config=extra)
        distributed(self.vc)
        self.prefix = (f"model.layers.{Rig._n}.mixer" if kind == "mamba2"
                       else f"model.layers.{Rig._n}.linear_attn")
        hf = self.vc.model_config.hf_text_config
        with set_current_vllm_config(self.vc):
            if kind == "mamba2":
                from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

                self.layer = MambaMixer2(
                    hidden_size=hf.hidden_size, ssm_state_size=hf.ssm_state_size,
                    conv_kernel_size=hf.conv_kernel,
                    intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim,
                    use_conv_bias=True, use_bias=False, n_groups=hf.n_groups,
                    num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim,
                    model_config=self.vc.model_config, cache_config=self.vc.cache_config,
                    prefix=self.prefix)
            else:
                from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
                    QwenGatedDeltaNetAttention,
                )

                self.layer = QwenGatedDeltaNetAttention(hf, self.vc, prefix=self.prefix)
                use_torch_chunk(self.layer)
        self._init_weights(weights_from, seed)
        self.spec = self.layer.get_kv_cache_spec(self.vc)
        self.raw = torch.zeros(num_blocks, 1, 1, self.spec.page_size_bytes, dtype=torch.int8)
        self.layer.bind_kv_cache(self.raw)
        if kind == "mamba2":
            from vllm.model_executor.layers.mamba.ops import ssu_dispatch
            from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
            from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

            self.builder = Mamba2AttentionMetadataBuilder(self.spec, [self.prefix], self.vc,
                                                          torch.device("cpu"))
            ssu_dispatch.initialize_mamba_ssu_backend(self.vc.mamba_config, KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=[],
                kv_cache_groups=[KVCacheGroupSpec([self.prefix], self.spec)]))
        else:
            from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

            self.builder = GDNAttentionMetadataBuilder(self.spec, [self.prefix], self.vc,
                                                       torch.device("cpu"))

    def _init_weights(self, other: Rig | None, seed: int) -> None:
        layer = self.layer
        if other is not None:
            for (n0, p0), (n1, p1) in zip(other.layer.named_parameters(),
                                          layer.named_parameters(), strict=True):
                assert n0 == n1
                p1.data.copy_(p0.data)
        else:
            g = torch.Generator().manual_seed(seed)
            for _, p in layer.named_parameters():
                p.data.copy_(torch.randn(p.shape, generator=g) * 0.3)
            if self.kind == "mamba2":
                layer.A.data.copy_(-torch.rand(layer.A.shape, generator=g) - 0.3)
        if self.kind == "mamba2":
            layer.conv_weights.copy_(layer.conv1d.weight.view(layer.conv_weights.shape))

    @property
    def width(self) -> int:
        """Columns of the op's first input for one token."""
        layer = self.layer
        if self.kind == "mamba2":
            return (2 * layer.intermediate_size + 2 * layer.n_groups * layer.ssm_state_size
                    + layer.num_heads)
        return layer.conv_dim

    def inputs(self, tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        dtype = self.vc.model_config.dtype
        if self.kind == "mamba2":
            return (torch.randn(tokens, self.width, generator=generator).to(dtype),)
        hv = self.layer.num_v_heads
        return (torch.randn(tokens, self.width, generator=generator).to(dtype),
                torch.randn(tokens, hv, generator=generator).to(dtype),
                torch.randn(tokens, hv, generator=generator).to(dtype))

    @torch.inference_mode()
    def step(self, reqs, inputs):
        """Run one batch; returns (output, the layer's metadata)."""
        from vllm.forward_context import set_forward_context
        from vllm.utils.torch_utils import _encode_layer_name

        md = self.builder.build(0, common_metadata(reqs))
        tokens = inputs[0].shape[0]
        dtype = self.vc.model_config.dtype
        name = _encode_layer_name(self.prefix)
        with set_forward_context({self.prefix: md}, self.vc):
            if self.kind == "mamba2":
                out = torch.zeros(tokens, self.layer.num_heads * self.layer.head_dim,
                                  dtype=dtype)
                torch.ops.vllm.mamba_mixer2(inputs[0], out, name)
            else:
                x, b, a = inputs
                out = torch.zeros(tokens, self.layer.num_v_heads, self.layer.head_v_dim,
                                  dtype=dtype)
                torch.ops.vllm.qwen_gdn_attention_core(x, b, a, out, name)
        return out.float(), md
