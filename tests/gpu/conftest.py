"""GPU checks of the decode kernels at the paper shapes, run compiled on a CUDA device with
``python -m pytest -m gpu tests/gpu``: the suite's conftest keeps Triton's interpreter off for a
``-m gpu`` run on a machine with CUDA. Without CUDA, or in a run whose kernels are interpreted,
every test here is skipped."""

from __future__ import annotations

import os

import pytest
import torch


def gpu_ready() -> bool:
    """CUDA is there and the kernels run compiled."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


needs_gpu = pytest.mark.skipif(not gpu_ready(), reason="needs CUDA and compiled kernels "
                               "(python -m pytest -m gpu tests/gpu)")
