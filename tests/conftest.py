"""Test setup: Triton kernels run interpreted on the CPU; the env var must be set before any
@triton.jit function is defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))
