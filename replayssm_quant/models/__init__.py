from .adapters import (
    ARCHITECTURES,
    DecayRecorder,
    ModelUnavailable,
    SSMLayer,
    UnsupportedArchitecture,
    architecture,
    load_model,
    model_shape,
    patch_model,
    ssm_layers,
    tiny_model,
)
from .fixture import FIXTURES, fixture, fixture_path

__all__ = [
    "ARCHITECTURES",
    "FIXTURES",
    "DecayRecorder",
    "ModelUnavailable",
    "SSMLayer",
    "UnsupportedArchitecture",
    "architecture",
    "fixture",
    "fixture_path",
    "load_model",
    "model_shape",
    "patch_model",
    "ssm_layers",
    "tiny_model",
]
