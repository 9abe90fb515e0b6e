"""Persistent launch grids sized by what an SM holds at once.

The flush kernels walk their tiles in a persistent loop, so the grid only sets how many
programs run side by side. A grid larger than the programs an SM can hold (registers, shared
memory, threads) leaves the late programs to start only when early ones have walked all
their tiles: on the H200 a Mamba-2 FP32 flush tile of 168 registers (12 programs per SM)
took 881 us on Nemotron-3-Super at 16 programs per SM, against 741 and 692 us at 8 and 24
(within one wave, two whole waves; commit 5504ea5). So the
default grid is one whole wave: the programs the compiled kernel leaves resident per SM, as
the CUDA driver's occupancy query reports them.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any

import torch

# sm_90 limits, used when the driver cannot be asked (occupancy of a compiled kernel).
SM_SUBPARTITIONS = 4
SUBPARTITION_REGS = 16384
SM_THREADS = 2048
SM_SHARED = 233472
SM_PROGRAMS = 32
REG_UNIT = 256  # registers per warp are allocated in units of 256
SHARED_RESERVED = 1024  # shared memory the system reserves per program

FALLBACK_PER_SM = 4  # the grid before programs were counted, for a Triton this cannot read

_RESIDENT: dict[tuple, int] = {}
_COMPILED: dict[tuple, dict[str, int]] = {}  # registers and shared bytes behind each count


def programs_per_sm(regs: int, warps: int, shared: int = 0, *, sm_threads: int = SM_THREADS,
                    sm_shared: int = SM_SHARED) -> int:
    """Programs of ``warps`` warps using ``regs`` registers per thread and ``shared`` bytes of
    shared memory that one sm_90 SM holds at once: each warp lives in one of the four
    sub-partitions and takes its registers (in 256-register units) from that quarter of the
    register file."""
    warp_regs = -(-max(1, regs) * 32 // REG_UNIT) * REG_UNIT
    by_regs = SM_SUBPARTITIONS * (SUBPARTITION_REGS // warp_regs) // warps
    by_threads = sm_threads // (32 * warps)
    by_shared = sm_shared // (shared + SHARED_RESERVED)
    return max(1, min(SM_PROGRAMS, by_regs, by_threads, by_shared))


def _driver_occupancy(function: int, threads: int, shared: int) -> int | None:
    """``cuOccupancyMaxActiveBlocksPerMultiprocessor`` for a loaded kernel, or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(function), ctypes.c_int(threads),
            ctypes.c_size_t(shared))
    except (OSError, AttributeError, TypeError):
        return None
    return n.value if rc == 0 and n.value > 0 else None


def _arg_key(a: Any) -> Any:
    """What of a launch argument can change the compiled kernel (Triton specializes pointers
    on their dtype and 16-byte alignment, integers on being 1 or a multiple of 16)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool) or a is None:
        return a
    if hasattr(a, "block_shape") and hasattr(a, "base"):  # a TensorDescriptor
        return ("desc", a.base.dtype, tuple(a.block_shape))
    if isinstance(a, int):
        return (a == 1, a % 16 == 0)
    return type(a).__name__


def _kwarg_key(v: Any) -> Any:
    """A keyword argument as it keys a specialization: constexpr values as they are, tensors
    and tensor descriptors (unhashable) by what Triton specializes them on."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else _arg_key(v)


def _unspecialized(kernel) -> set[int]:
    """Positions of the arguments Triton does not specialize on (``do_not_specialize``, given
    as names or positions), e.g. a row count that changes with the batch size."""
    names = getattr(kernel, "arg_names", None) or []
    out = set()
    for a in getattr(kernel, "do_not_specialize", None) or ():
        if isinstance(a, int):
            out.add(a)
        elif a in names:
            out.add(names.index(a))
    return out


def resident_programs(kernel, device: torch.device, args: tuple, kwargs: dict) -> int:
    """Programs per SM of ``kernel`` compiled for these arguments (compiled without a launch,
    once per specialization: arguments Triton does not specialize on, such as the batch's
    row count, do not make a new one, so a new batch size asks nothing new)."""
    skip = _unspecialized(kernel)
    key = (kernel, device.index, tuple(sorted((k, _kwarg_key(v)) for k, v in kwargs.items())),
           tuple(_arg_key(a) for i, a in enumerate(args) if i not in skip))
    n = _RESIDENT.get(key)
    if n is None:
        try:
            compiled = kernel.warmup(*args, grid=(1,), **kwargs)
            compiled._init_handles()
            warps, shared = compiled.metadata.num_warps, compiled.metadata.shared
        except (AttributeError, TypeError) as err:  # a Triton without these internals
            warnings.warn(f"cannot size the persistent grid from the compiled kernel ({err}); "
                          f"using {FALLBACK_PER_SM} programs per SM", RuntimeWarning, stacklevel=2)
            _RESIDENT[key] = FALLBACK_PER_SM
            return FALLBACK_PER_SM
        _COMPILED[key] = {"regs": compiled.n_regs, "shared": shared}
        n = _driver_occupancy(compiled.function, 32 * warps, shared)
        if n is None:
            props = torch.cuda.get_device_properties(device)
            n = programs_per_sm(compiled.n_regs, warps, shared,
                                sm_threads=props.max_threads_per_multi_processor,
                                sm_shared=getattr(props, "shared_memory_per_multiprocessor", SM_SHARED))
        _RESIDENT[key] = n
    return n


def resident_table() -> list[tuple[str, dict, int]]:
    """(kernel name, tile knobs, resident programs per SM) of every specialization sized so
    far, for benchmark logs; the knobs end with the compiled kernel's ``regs`` and
    ``shared`` bytes where it was compiled here (what limits the count)."""
    keys = ("BPF", "BVF", "num_warps", "maxnreg", "STAGES", "TMA", "RECORDS", "CK_FMT", "RD_FMT",
            "SR", "P", "V")
    out = []
    for key, n in _RESIDENT.items():
        kw = dict(key[2])
        name = getattr(getattr(key[0], "fn", None), "__name__", str(key[0]))
        out.append((name, {**{k: kw[k] for k in keys if k in kw}, **_COMPILED.get(key, {})}, n))
    return out


def persistent_programs(kernel, device: torch.device, tiles: int, per_sm: int | None,
                        args: tuple, kwargs: dict) -> int:
    """Grid of a persistent launch over ``tiles`` work items: ``per_sm`` programs per SM when
    given, else the compiled kernel's resident programs per SM; never more programs than
    tiles; four on devices without SMs (the interpreter)."""
    if device.type != "cuda":
        return max(1, min(tiles, 4))
    per_sm = per_sm or resident_programs(kernel, device, args, kwargs)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles, per_sm * sms))


def launch_persistent(kernel, device: torch.device, tiles: int, per_sm: int | None,
                      *args, **kwargs) -> None:
    """Launch a persistent kernel on ``persistent_programs`` programs."""
    grid = (persistent_programs(kernel, device, tiles, per_sm, args, kwargs),)
    kernel[grid](*args, **kwargs)
