"""The page: the layer's page equals the model class's page (vLLM asserts this when it pads the
page) for every checkpoint format x read format x TP size, every view is aligned and inside its
slot, the kernels' views alias vLLM's, and architectures the plugin does not cover keep the
stock page."""

import itertools
from math import prod

import pytest

pytest.importorskip("vllm")

import harness as H  # noqa: E402
import torch  # noqa: E402

from replayssm_quant.precision import SHAPES  # noqa: E402
from replayssm_quant.vllm_plugin.layout import ALIGN, stock_page  # noqa: E402

H.inspect_models_in_process()

CKPT = ("fp32", "fp16:sr", "bf16", "fp8:sr", "nvfp4")
READ = ("none", "fp32", "fp16", "bf16", "fp8", "nvfp4")
REPLAY_CONFIGS = [f"ckpt={c},read={r},L=4" for c, r in itertools.product(CKPT, READ)
                  if not (c == "fp32" and r == "fp32")]
CONVENTIONAL_CONFIGS = [f"ckpt={c},read=none,L=1" for c in CKPT]
# n_groups=4 so TP=4 splits the groups; Qwen: 4 key heads, 8 value heads
MAMBA_OVERRIDES = (("n_groups", 4),)


def _tp_patch(monkeypatch, tp: int) -> None:
    """Build layers as TP rank 0 of ``tp`` (sizing only; no collective runs)."""
    import vllm.model_executor.layers.mamba.gdn.base as gdn_base
    import vllm.model_executor.layers.mamba.mamba_mixer2 as mm2

    for mod in (mm2, gdn_base):
        monkeypatch.setattr(mod, "get_tensor_model_parallel_world_size", lambda: tp)
        monkeypatch.setattr(mod, "get_tensor_model_parallel_rank", lambda: 0)


def _build(kind, vc):
    from vllm.config import set_current_vllm_config

    if kind == "mamba2":
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

        hf = vc.model_config.hf_config
        with set_current_vllm_config(vc):
            return MambaMixer2(
                hidden_size=hf.hidden_size, ssm_state_size=hf.ssm_state_size,
                conv_kernel_size=hf.conv_kernel,
                intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim, use_conv_bias=True,
                use_bias=False, n_groups=hf.n_groups, num_heads=hf.mamba_num_heads,
                head_dim=hf.mamba_head_dim, model_config=vc.model_config,
                cache_config=vc.cache_config, prefix=f"model.layers.{_build.n}.mixer")
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
        QwenGatedDeltaNetAttention,
    )

    with set_current_vllm_config(vc):
        return QwenGatedDeltaNetAttention(vc.model_config.hf_text_config, vc,
                                          prefix=f"model.layers.{_build.n}.linear_attn")


_build.n = 0


def _layer(kind, vc):
    _build.n += 1
    vc.compilation_config.static_forward_context.clear()
    return _build(kind, vc)


def _check_page(kind, vc, cls):
    from vllm.v1.kv_cache_interface import MambaSpec

    layer = _layer(kind, vc)
    assert layer.replayssm_enabled
    hf = vc.model_config.hf_text_config
    heads = hf.mamba_num_heads if kind == "mamba2" else hf.linear_num_value_heads
    tp = vc.parallel_config.tensor_parallel_size
    assert layer.get_state_shape()[1][0] == heads // tp
    cls_shapes = cls.get_mamba_state_shape_from_config(vc)
    cls_dtypes = cls.get_mamba_state_dtype_from_config(vc)
    spec = layer.get_kv_cache_spec(vc)
    assert tuple(spec.shapes) == tuple(cls_shapes)
    assert tuple(spec.dtypes) == tuple(cls_dtypes)
    page = MambaSpec(shapes=cls_shapes, dtypes=cls_dtypes, block_size=-1).page_size_bytes
    assert page == spec.page_size_bytes and page % ALIGN == 0
    # vLLM pads the page to the class's size and asserts it covers the layer's
    vc.cache_config.mamba_page_size_padded = page + 64
    assert layer.get_kv_cache_spec(vc).page_size_bytes == page + 64
    vc.cache_config.mamba_page_size_padded = None
    _check_views(layer, page + 64)
    return layer


def _check_views(layer, stride):
    nb = 3
    raw = torch.zeros(nb, 1, 1, stride, dtype=torch.int8)
    layer.bind_kv_cache(raw)
    base, end = raw.data_ptr(), raw.data_ptr() + raw.numel()
    layout = layer.replayssm_page()
    cache = layer.replayssm_cache
    views = {"ckpt.data": cache.ckpt.data}
    for prefix, st in (("ckpt", cache.ckpt), ("read", cache.read)):
        if st is None:
            continue
        for field in ("data", "row_scale", "block_scale"):
            t = getattr(st, field)
            if t is not None:
                views[f"{prefix}.{field}"] = t
    views.update({f"ring.{k}": v for k, v in cache.ring.items()})
    assert set(views) == {p.name for p in layout.parts if p.name != "conv"}
    spans = []
    for name, t in views.items():
        part = layout.part(name)
        assert t.shape == (nb, *part.shape) and t.dtype == part.dtype, name
        assert t.stride(0) * t.element_size() == stride, name
        assert t[0].is_contiguous(), name
        off = t.data_ptr() - base
        assert off == part.offset, name
        assert off % t.element_size() == 0, name
        if part.offset >= layout.page_bytes - layout.tail_bytes:
            assert off % ALIGN == 0, f"{name} at {off}"
        assert base <= t.data_ptr() and t[-1].data_ptr() + part.nbytes <= end
        spans.append((part.offset, part.offset + part.nbytes, name))
    spans.sort()
    for (_, e0, n0), (s1, _, n1) in itertools.pairwise(spans):
        assert e0 <= s1, f"{n0} overlaps {n1}"
    # the kernels' views alias vLLM's views of the stock entries
    assert cache.ckpt.data.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
    assert cache.ckpt.data.data_ptr() == layer.kv_cache[1].data_ptr()
    if "x" in cache.ring:
        for i, name in ((2, "x"), (3, "dt"), (4, "B")):
            assert cache.ring[name].data_ptr() == layer.kv_cache[i].data_ptr()
    assert cache.cursor.shape == (nb,) and cache.flush_index.shape == (nb,)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind,arch", [("mamba2", "NemotronHForCausalLM"),
                                       ("gdn", "Qwen3_5ForCausalLM")])
def test_layer_page_equals_class_page(monkeypatch, kind, arch, tp):
    from vllm.model_executor.models import ModelRegistry

    H.distributed(H.engine_config(arch))
    _tp_patch(monkeypatch, tp)
    over = MAMBA_OVERRIDES if kind == "mamba2" else ()
    checked = 0
    for replay, configs in ((True, REPLAY_CONFIGS), (False, CONVENTIONAL_CONFIGS)):
        vc = H.engine_config(arch, overrides=over, tensor_parallel_size=tp,
                             use_replayssm=replay, replayssm_buffer_len=4,
                             additional_config={"replayssm_quant": configs[0]})
        cls, _ = ModelRegistry.resolve_model_cls(arch, model_config=vc.model_config)
        for text in configs:
            vc.additional_config["replayssm_quant"] = text
            _check_page(kind, vc, cls)
            checked += 1
    assert checked == len(REPLAY_CONFIGS) + len(CONVENTIONAL_CONFIGS)


def test_mamba_single_group_replicated_over_tp(monkeypatch):
    """n_groups=1 with TP=2: vLLM replicates the group; the B ring follows."""
    from vllm.model_executor.models import ModelRegistry

    arch = "NemotronHForCausalLM"
    H.distributed(H.engine_config(arch))
    _tp_patch(monkeypatch, 2)
    vc = H.engine_config(arch, overrides=(("n_groups", 1),), tensor_parallel_size=2,
                         use_replayssm=True, replayssm_buffer_len=4,
                         additional_config={"replayssm_quant": "nvfp4-read/fp16-sr"})
    cls, _ = ModelRegistry.resolve_model_cls(arch, model_config=vc.model_config)
    layer = _check_page("mamba2", vc, cls)
    assert layer.replayssm_cache.ring["B"].shape[1] == 1


@pytest.mark.parametrize("arch", ["Mamba2ForCausalLM", "NemotronHForCausalLM"])
def test_stock_page_where_the_plugin_is_off(arch):
    """An architecture the plugin does not cover (its MambaMixer2 is the plugin's class, inert)
    and a covered one without the plugin's config keep vLLM's page and kernels."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.model_executor.models import ModelRegistry

    extra = {"replayssm_quant": "fp16-sr"} if arch == "Mamba2ForCausalLM" else {}
    vc = H.engine_config(arch, additional_config=extra)
    H.distributed(vc)
    hf = vc.model_config.hf_config
    from vllm.config import set_current_vllm_config

    vc.compilation_config.static_forward_context.clear()
    heads = getattr(hf, "mamba_num_heads", None) or hf.num_heads
    head_dim = getattr(hf, "mamba_head_dim", None) or hf.head_dim
    with set_current_vllm_config(vc):
        layer = MambaMixer2(hidden_size=hf.hidden_size,
                            ssm_state_size=getattr(hf, "ssm_state_size", None) or hf.state_size,
                            conv_kernel_size=hf.conv_kernel, intermediate_size=heads * head_dim,
                            use_conv_bias=True, use_bias=False, n_groups=hf.n_groups,
                            num_heads=heads, head_dim=head_dim, model_config=vc.model_config,
                            cache_config=vc.cache_config, prefix="model.layers.0.mixer")
    assert type(layer).__name__ == "ReplaySSMMambaMixer2" and not layer.replayssm_enabled
    assert layer.get_state_shape() == MambaMixer2.get_state_shape(layer)
    assert layer.get_state_dtype() == MambaMixer2.get_state_dtype(layer)
    cls, _ = ModelRegistry.resolve_model_cls(arch, model_config=vc.model_config)
    assert tuple(cls.get_mamba_state_shape_from_config(vc)) == tuple(layer.get_state_shape())
    layer.bind_kv_cache(torch.zeros(2, 1, 1, layer.get_kv_cache_spec(vc).page_size_bytes,
                                    dtype=torch.int8))
    assert layer.replayssm_cache is None and len(layer.kv_cache) == 2


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("name", list(SHAPES))
def test_layout_mirror_matches_vllm_stock_page(name, tp):
    """``layout.stock_page`` (what ``configs --vllm-page`` uses without vLLM) equals vLLM's own
    stock entries for the paper's shapes."""
    from vllm.config.mamba import MambaBackendEnum
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator as C

    from replayssm_quant.precision import PRESETS

    shape = SHAPES[name]
    for cfg in (PRESETS["fp32"], PRESETS["nvfp4-read/fp32"]):
        ours, _ = stock_page(shape, cfg, tp=tp)
        if shape.kind == "mamba2":
            base = C.mamba2_state_shape(tp_world_size=tp, intermediate_size=shape.rows,
                                        n_groups=shape.groups, num_heads=shape.heads,
                                        head_dim=shape.head_dim, state_size=shape.d_state,
                                        conv_kernel=4)
            if cfg.L > 1:
                base = C.append_replayssm_ring(base, n_groups=shape.groups, tp_world_size=tp,
                                               logical_window=cfg.L,
                                               backend=MambaBackendEnum.TRITON)
        else:
            base = C.gated_delta_net_state_shape(tp, shape.groups, shape.heads, shape.d_state,
                                                 shape.head_dim, 4)
        assert [tuple(s) for s in ours] == [tuple(s) for s in base]
        assert prod(ours[1]) * 4 == prod(base[1]) * 4
