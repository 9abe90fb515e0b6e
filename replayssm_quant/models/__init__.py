"""Adapters onto Hugging Face hybrid models.

``registry`` (supported architectures, SSM layers and shapes), ``loading`` (fixtures, hub ids,
local folders), ``tiny`` (random tiny models), ``fixture`` (the bundled trained ones), ``forward``
(decoder and LM head run apart), ``patch`` (the drift patch) and ``decode`` (ReplaySSM decoding).
"""

from .fixture import FIXTURES, fixture, fixture_path
from .forward import decoder_hidden_states, lm_head_logits
from .loading import ModelUnavailable, hub_offline, hub_reachable, load_model
from .patch import ModelPatch, patch_model
from .registry import (
    ARCHITECTURES,
    SSMLayer,
    UnsupportedArchitecture,
    architecture,
    model_shape,
    ssm_layers,
)
from .tiny import RANDOM_PREFIX, byte_tokenizer, tiny_model

__all__ = [
    "ARCHITECTURES",
    "FIXTURES",
    "RANDOM_PREFIX",
    "ModelPatch",
    "ModelUnavailable",
    "SSMLayer",
    "UnsupportedArchitecture",
    "architecture",
    "byte_tokenizer",
    "decoder_hidden_states",
    "fixture",
    "fixture_path",
    "hub_offline",
    "hub_reachable",
    "lm_head_logits",
    "load_model",
    "model_shape",
    "patch_model",
    "ssm_layers",
    "tiny_model",
]
