"""Test setup: Triton kernels run interpreted on the CPU; the env var must be set before any
@triton.jit function is defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402


def _intra_op_threads() -> int:
    """Intra-op threads per test process: the cores divided among the xdist workers (at most
    two). Workers that together run more threads than there are cores leave OpenMP threads
    spinning at barriers for peers the OS has descheduled: on two cores with ``-n 2`` the
    interpreted kernel tests ran 2-3x slower at two threads each, by how the other worker's
    tests happened to overlap them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


torch.set_num_threads(_intra_op_threads())
