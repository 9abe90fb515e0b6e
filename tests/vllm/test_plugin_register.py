"""Discovery, idempotency, version check and kill switch of the vLLM general plugin."""

import pytest

pytest.importorskip("vllm")

import harness  # noqa: E402,F401  (CPU target before vLLM starts)
import vllm  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402
from vllm.model_executor.models import config as model_configs  # noqa: E402

import replayssm_quant.vllm_plugin as plugin  # noqa: E402
from replayssm_quant.vllm_plugin import ARCHITECTURES, hooks  # noqa: E402


def test_entry_point_declared_and_loadable():
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "replayssm_quant"]
    assert len(eps) == 1
    assert eps[0].value == "replayssm_quant.vllm_plugin:register"
    assert eps[0].load() is plugin.register


def test_vllm_discovers_the_plugin(monkeypatch):
    from vllm import plugins

    monkeypatch.setenv("VLLM_PLUGINS", "replayssm_quant")
    found = plugins.load_plugins_by_group(plugins.DEFAULT_PLUGINS_GROUP)
    assert found["replayssm_quant"] is plugin.register
    monkeypatch.setenv("VLLM_PLUGINS", "someone_else")
    assert "replayssm_quant" not in plugins.load_plugins_by_group(plugins.DEFAULT_PLUGINS_GROUP)


def _ours(arch: str) -> bool:
    model = ModelRegistry.models[arch]
    return getattr(model, "module_name", "").startswith("replayssm_quant.vllm_plugin.")


def test_register_covers_every_architecture_and_is_idempotent(monkeypatch):
    plugin.register()
    assert all(_ours(a) for a in ARCHITECTURES)
    wrapped = {a: model_configs.MODELS_CONFIG_MAP[a] for a in ARCHITECTURES}
    assert all(getattr(c, "_replayssm_quant_check", False) for c in wrapped.values())
    # a second full registration (as a second process-wide load would do) changes nothing
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()
    plugin.register()
    assert {a: model_configs.MODELS_CONFIG_MAP[a] for a in ARCHITECTURES} == wrapped
    for cls in wrapped.values():  # never a check wrapped around a check
        assert not getattr(cls.__mro__[1], "_replayssm_quant_check", False)


def test_layer_registration_and_kernel_hooks_are_idempotent():
    from vllm.model_executor.custom_op import op_registry_oot

    from replayssm_quant.vllm_plugin import gdn, mamba2

    for _ in range(2):
        mamba2.register_layer()
        gdn.register_layer()
    assert op_registry_oot["MambaMixer2"] is mamba2.ReplaySSMMambaMixer2
    assert op_registry_oot["QwenGatedDeltaNetAttention"] is gdn.ReplaySSMQwenGDN
    import importlib

    for module_name, names in hooks._PATCHES.items():
        module = importlib.import_module(module_name)
        for name in names:
            inner = getattr(getattr(module, name), hooks._MARK)
            assert not hasattr(inner, hooks._MARK), f"{name} wrapped twice"


def test_kill_switch(monkeypatch):
    from vllm import plugins

    calls = []
    monkeypatch.setattr(ModelRegistry, "register_model", lambda *a: calls.append(a))
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setenv(plugin.DISABLE_ENV, "1")
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    monkeypatch.setenv("VLLM_PLUGINS", "replayssm_quant")
    plugins.load_general_plugins()
    assert calls == [] and plugin._registered is False
    monkeypatch.setenv(plugin.DISABLE_ENV, "0")
    plugin.register()
    assert len(calls) == len(ARCHITECTURES)


@pytest.mark.parametrize("version,ok", [("0.33.0", True), ("0.33.2", True), ("0.33.1rc1", True),
                                        ("0.34.0", False), ("0.32.9", False), ("1.0", False),
                                        ("not-a-version", False)])
def test_version_check(version, ok):
    if ok:
        plugin.check_vllm_version(version)
        return
    with pytest.raises(RuntimeError, match=r"vllm>=0\.33,<0\.34.*REPLAYSSM_QUANT_DISABLE=1"):
        plugin.check_vllm_version(version)


def test_register_refuses_another_vllm(monkeypatch):
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(vllm, "__version__", "0.34.1")
    with pytest.raises(RuntimeError, match="found vllm 0.34.1"):
        plugin.register()
