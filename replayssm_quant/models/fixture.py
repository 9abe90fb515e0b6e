"""Small trained hybrid language models shipped with the package.

Drift and task measurements need a model whose next-token distributions are sharp, and no
pretrained hybrid model can be fetched offline. The fixtures are real (tiny) language models of
the production Hugging Face classes, trained on Project Gutenberg plays by
``tools/train_fixtures.py``; each folder holds the weights (bf16), the tokenizer and a model card.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FIXTURES: tuple[str, ...] = ("nemotron-h-tiny", "qwen3.5-tiny")
"""``nemotron-h-tiny``: NemotronH (Mamba-2 hybrid); ``qwen3.5-tiny``: Qwen3.5 (Gated DeltaNet)."""

_ROOT = Path(__file__).resolve().parent / "fixtures"


def fixture_path(name: str) -> Path:
    """Folder of fixture ``name`` inside the installed package."""
    if name not in FIXTURES:
        raise KeyError(f"unknown fixture {name!r}; available: {', '.join(FIXTURES)}")
    path = _ROOT / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"fixture {name!r} is not present at {path}; rebuild it with tools/train_fixtures.py"
        )
    return path


def probe_trained(name: str) -> bool:
    """Whether fixture ``name`` was also trained on the probe tasks (``tools/train_probes.py``
    writes a ``probe_training`` section into its card); one that was not writes play-like text
    on every probe prompt, so its probe accuracy is 0 under every config."""
    card = json.loads((fixture_path(name) / "card.json").read_text())
    return "probe_training" in card


def fixture(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Load fixture ``name`` as ``(model, tokenizer)``, offline, in eval mode.

    The weights are stored in bf16; ``dtype`` is the compute dtype (float32 by default, so the
    reference runs of the drift evaluation are not limited by bf16 arithmetic).
    """
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path = fixture_path(name)
    from .window import apply_attention_window

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    apply_attention_window(model)
    model.to(device)
    model.eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return model, tokenizer
