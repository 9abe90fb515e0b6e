"""Test setup: Triton kernels run interpreted on the CPU; the env var must be set before any
@triton.jit function is defined. A run selected with ``-m gpu`` on a machine with CUDA (the GPU
checks in ``tests/gpu``) runs them compiled instead."""

import os
import sys


def _gpu_run() -> bool:
    """``pytest -m gpu`` (or ``-m=gpu``): decided from the command line, because the choice must
    be made before pytest has parsed its options into a config."""
    argv = sys.argv[1:]
    marks = [b for a, b in zip(argv, argv[1:], strict=False) if a == "-m"]
    marks += [a[3:] for a in argv if a.startswith("-m=")]
    return any(m.strip() == "gpu" for m in marks)


if _gpu_run():
    import torch as _torch

    if _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "0")
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
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


def _skip_repeated_language_patching() -> None:
    """Triton's interpreter maps ``triton.language`` onto its own implementations when a
    launch starts (and undoes that when it ends), then maps it again, identically, at every
    call of a ``@triton.jit`` helper inside the launch, listing every member of the language
    each time: about a quarter of an interpreted kernel test. Within a launch, a helper whose
    language modules the launch has mapped already skips the repeat; every launch, and a
    helper that sees a module not mapped yet, still maps. The kernels run as before. An
    interpreter without these internals runs unchanged."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter as ti

        patch_lang, launch, scope = ti._patch_lang, ti.GridExecutor.__call__, ti._LangPatchScope
        lang, core = ti.tl, ti.tl.core
    except (ImportError, AttributeError):
        return
    mapped: list[set[int]] = []  # ids of the language modules each running launch has mapped

    def modules(fn) -> set[int]:  # the modules ``_patch_lang`` maps for ``fn``
        return {id(v) for v in fn.__globals__.values() if v is lang or v is core}

    def _patch_lang(fn):
        if mapped:
            need = modules(fn)
            if need and need <= mapped[-1]:
                return scope()
            mapped[-1] |= need
        return patch_lang(fn)

    def __call__(self, *args, **kwargs):
        mapped.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            mapped.pop()

    ti._patch_lang = _patch_lang
    ti.GridExecutor.__call__ = __call__


_skip_repeated_language_patching()


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for tests of many tiny ops (emulation, token-by-token decoding): extra
    threads only add synchronisation there. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
