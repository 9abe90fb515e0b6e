"""Config time: every covered architecture builds an engine config with the plugin, and each
combination the plugin cannot serve is rejected with its own message."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

import harness as H  # noqa: E402

from replayssm_quant.vllm_plugin import ARCHITECTURES  # noqa: E402
from replayssm_quant.vllm_plugin.settings import ConfigError, settings_for, validate  # noqa: E402

H.inspect_models_in_process()
MAMBA = "NemotronHForCausalLM"
GDN = "Qwen3_5ForCausalLM"
REPLAY = dict(use_replayssm=True, additional_config={"replayssm_quant": "nvfp4-read/fp8-sr"})


def _resolve(vc):
    from vllm.model_executor.models import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architecture,
                                             model_config=vc.model_config)
    return cls


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_engine_config_with_plugin(arch):
    vc = H.engine_config(arch, replayssm_buffer_len=8, **REPLAY)
    assert vc.model_config.supports_replayssm
    cls = _resolve(vc)
    assert cls.__module__.startswith("replayssm_quant.vllm_plugin.")
    s = settings_for(vc)
    assert str(s.config) == "ckpt=fp8:sr,read=nvfp4,L=8" and s.seed == 0
    shapes = cls.get_mamba_state_shape_from_config(vc)
    assert shapes[-1][0] > 0 and len(shapes) == (6 if s.kind == "mamba2" else 3)


@pytest.mark.parametrize("arch", [MAMBA, GDN])
@pytest.mark.parametrize("extra", [
    {"replayssm_quant": "fp16-sr"},
    {"replayssm_quant": {"ckpt": "bf16:sr", "seed": 7}},
    {"replayssm_quant": {"config": "ckpt=fp8:sr,read=none,L=1", "seed": "3"}},
])
def test_conventional_configs_without_replayssm(arch, extra):
    vc = H.engine_config(arch, additional_config=extra)
    s = settings_for(vc)
    assert s.config.L == 1 and not vc.cache_config.use_replayssm


def test_dotted_form_and_seed():
    vc = H.engine_config(GDN, use_replayssm=True, additional_config={
        "replayssm_quant": {"ckpt": "fp16:sr", "read": "nvfp4", "seed": 11}})
    s = settings_for(vc)
    assert str(s.config) == "ckpt=fp16:sr,read=nvfp4,L=16" and s.seed == 11


def test_plugin_off_without_its_config():
    vc = H.engine_config(MAMBA)
    assert settings_for(vc) is None
    assert _resolve(vc).get_mamba_state_shape_from_config(vc) == \
        _resolve(vc).__mro__[2].get_mamba_state_shape_from_config(vc)


REJECTED = [
    ("prefix caching", GDN, dict(REPLAY, enable_prefix_caching=True), "--no-enable-prefix-caching"),
    ("spec decoding", GDN, dict(REPLAY, speculative_config={
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
     "speculative decoding is not supported"),
    ("spec decoding, conventional", MAMBA, dict(
        additional_config={"replayssm_quant": "fp16-sr"}, speculative_config={
            "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
     "speculative decoding is not supported"),
    ("KV connector", GDN, dict(additional_config={"replayssm_quant": "fp16-sr"},
                               kv_transfer_config={"kv_connector": "ExampleConnector",
                                                   "kv_role": "kv_both"}),
     "KV connectors"),
    ("nvfp4 blocks", MAMBA, dict(REPLAY, overrides=(("ssm_state_size", 48),)),
     "d_state=48 does not fit NVFP4.*multiple of 32"),
    ("nvfp4 blocks gdn", GDN, dict(REPLAY, overrides=(("linear_key_head_dim", 48),)),
     r"d_k \(linear_key_head_dim\)=48 does not fit NVFP4"),
    ("kernel rows", GDN, dict(use_replayssm=True, overrides=(("linear_key_head_dim", 48),),
                              additional_config={"replayssm_quant": "fp8-read/fp32"}),
     "power of two >= 32"),
    ("L written twice", MAMBA, dict(use_replayssm=True, replayssm_buffer_len=8, additional_config={
        "replayssm_quant": "ckpt=fp32,read=nvfp4,L=16"}), "L comes from --replayssm-buffer-len"),
    ("replay without flag", GDN, dict(additional_config={"replayssm_quant": "shared-fp8"}),
     "add --use-replayssm"),
    ("read copy without flag", GDN, dict(additional_config={
        "replayssm_quant": "ckpt=fp32,read=fp8"}), "a read copy needs ReplaySSM"),
    ("conventional with flag", MAMBA, dict(use_replayssm=True, additional_config={
        "replayssm_quant": "bf16-sr"}), "conventional decoding"),
    ("gdn flag without config", GDN, dict(use_replayssm=True), "needs their config"),
    ("unknown preset", MAMBA, dict(use_replayssm=True, additional_config={
        "replayssm_quant": "nvfp4-everything"}), "unknown preset"),
    ("unknown key", MAMBA, dict(use_replayssm=True, additional_config={
        "replayssm_quant": {"ckpt": "fp32", "raed": "nvfp4"}}), "unknown replayssm_quant keys"),
    ("flashinfer", MAMBA, dict(REPLAY, mamba_backend="flashinfer"), "--mamba-backend triton"),
]


@pytest.mark.parametrize("name,arch,kwargs,message", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_at_config_time(name, arch, kwargs, message):
    kwargs = dict(kwargs)
    overrides = kwargs.pop("overrides", ())
    with pytest.raises(Exception, match=message):
        H.engine_config(arch, overrides=overrides, **kwargs)


def _fake_config(**cache):
    base = dict(use_replayssm=True, replayssm_buffer_len=16, enable_prefix_caching=False,
                mamba_cache_mode="none")
    base.update(cache)
    return SimpleNamespace(
        additional_config={"replayssm_quant": "nvfp4-read/fp32"},
        model_config=SimpleNamespace(architecture=GDN, hf_text_config=SimpleNamespace(
            linear_key_head_dim=128)),
        cache_config=SimpleNamespace(**base), speculative_config=None, kv_transfer_config=None,
        mamba_config=SimpleNamespace(backend=SimpleNamespace(name="TRITON"),
                                     enable_stochastic_rounding=False),
        use_v2_model_runner=False)


def test_rejects_v2_runner_and_vllm_sr():
    """The V1 runner is forced on this CPU build, so these two are checked on a stand-in."""
    assert validate(_fake_config()).config.read.name == "nvfp4"
    vc = _fake_config()
    vc.use_v2_model_runner = True
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        validate(vc)
    vc = _fake_config()
    vc.mamba_config.enable_stochastic_rounding = True
    with pytest.raises(ConfigError, match="enable-mamba-cache-stochastic-rounding"):
        validate(vc)


def test_unlisted_architecture_ignores_the_config():
    vc = H.engine_config("Mamba2ForCausalLM", use_replayssm=False,
                         additional_config={"replayssm_quant": "fp16-sr"})
    assert settings_for(vc) is None
