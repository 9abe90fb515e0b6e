"""GPU checks of the decode kernels at the paper shapes, run compiled on a CUDA device with
``python -m pytest -m gpu tests/gpu``. The suite's conftest runs Triton interpreted; a run
selected with ``-m gpu`` on a machine with CUDA turns the interpreter off before any kernel is
defined. Without CUDA, or where the kernels were already defined interpreted, every test here
is skipped."""

from __future__ import annotations

import os
import sys

import pytest
import torch


def pytest_configure(config) -> None:
    if (torch.cuda.is_available() and (config.getoption("markexpr", "") or "").strip() == "gpu"
            and "replayssm_quant.kernels" not in sys.modules):
        os.environ["TRITON_INTERPRET"] = "0"


def gpu_ready() -> bool:
    """CUDA is there and the kernels run compiled."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


needs_gpu = pytest.mark.skipif(not gpu_ready(), reason="needs CUDA and compiled kernels "
                               "(python -m pytest -m gpu tests/gpu)")
