"""replayssm-quant: ReplaySSM decode kernels, exact emulators and state-precision
recommendations for hybrid SSM models (Mamba-2, Gated DeltaNet)."""

from .precision import PRESETS, PrecisionConfig, parse_config

__version__ = "0.1.0"
__all__ = ["PRESETS", "PrecisionConfig", "__version__", "parse_config"]
