"""Memory and launch helpers shared by every kernel: register caps, TMA tensor descriptors,
programmatic dependent launch (PDL) waits and releases, L2 prefetch, and the (row, head, tile)
grid order of the per-row step kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .rounding import PTX
from .target import Target

# A non-flush step's fp8 / NVFP4 read-copy rows are read once per step; marked first to leave
# L2, they leave the ring records that every tile of a head reads in L2. The conventional step's
# and the flushes' state loads carry no hint (slower with it). A compile-time constant of the
# kernels, not a per-GPU choice. Evidence: 1d673c0, tune_decode batch 256: GDN fp8 non-flush
# 93.6 -> 85.3 us (Qwen3.5-4B); on other loads 1.3-2.6% slower.
STREAM: tl.constexpr = tl.constexpr("evict_first")


def register_cap(maxnreg: int | None) -> dict:
    """Launch options capping a kernel's registers per thread (Triton's ``maxnreg``): fewer
    registers let an SM hold more warps, which hides the latency of kernels bound by it, at
    the cost of spills where the cap is below what the kernel needs. None: no cap."""
    if maxnreg is None:
        return {}
    if isinstance(maxnreg, bool) or not isinstance(maxnreg, int) or not 24 <= maxnreg <= 255:
        raise ValueError(f"maxnreg must be an integer from 24 to 255 or None, got {maxnreg!r}")
    return {"maxnreg": maxnreg}


def tma_layout_problem(data: torch.Tensor) -> str | None:
    """Why a checkpoint's data cannot be moved by a TMA tensor descriptor of its ``(slots,
    heads * rows, d)`` view, or None when it can: fp32, each slot's ``(heads, rows, d)``
    contiguous, base and slot stride on 16-byte boundaries."""
    if data.dtype != torch.float32:
        return f"flush_tma moves an fp32 checkpoint, got {data.dtype}"
    slots, heads, rows, d = data.shape
    if data.stride()[1:] != (rows * d, d, 1):
        return ("flush_tma needs each slot's (heads, rows, d) contiguous, got strides "
                f"{tuple(data.stride())}")
    if data.data_ptr() % 16 or (data.stride(0) * 4) % 16:
        return "flush_tma needs a 16-byte aligned checkpoint and slot stride"
    return None


def state_descriptor(st, block_rows: int, tma: bool):
    """For a flush that moves an fp32 checkpoint through the tensor memory accelerator
    (``tma``): a tensor descriptor of its ``(slots, heads * rows, d)`` view with blocks of
    ``block_rows`` whole rows of one slot; else None. The view keeps the slot stride, so
    strided vLLM pages work; a layout ``tma_layout_problem`` names is refused."""
    if not tma:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    problem = tma_layout_problem(st.data)
    if problem:
        raise ValueError(problem)
    slots, heads, rows, d = st.data.shape
    view = st.data.view(slots, heads * rows, d)
    return TensorDescriptor.from_tensor(view, [1, block_rows, d])


def resolve_flush_tma(tma: bool | None, cfg, rows: int, block_rows: int, one_launch: bool,
                      device, data: torch.Tensor | None = None) -> bool:
    """Whether the persistent flush moves its checkpoint tiles through the tensor memory
    accelerator (TMA, ``state_descriptor``): only an fp32 checkpoint without a read copy, in
    whole tiles (``rows`` per head a multiple of the flush tile's ``block_rows``), on sm_90+
    or under the interpreter, with checkpoint ``data`` a descriptor can address
    (``tma_layout_problem``). None: wherever it applies (with 2 pipelining stages it beat
    cp.async loads with 3 on every paper shape at batch 256, commit 3be1d81). True where it
    does not apply is refused."""
    gpu_ok = Target.of(device).tma
    fits = (cfg.ckpt.name == "fp32" and cfg.read is None and rows % block_rows == 0
            and not one_launch)
    if tma is None:
        return fits and gpu_ok and (data is None or tma_layout_problem(data) is None)
    if not tma:
        return False
    if cfg.ckpt.name != "fp32" or cfg.read is not None:
        raise ValueError("flush_tma applies to an fp32 checkpoint without a read copy, got "
                         f"{cfg}")
    if rows % block_rows:
        raise ValueError(f"flush_tma needs whole flush tiles: {rows} rows per head are no "
                         f"multiple of {block_rows}")
    if one_launch:
        raise ValueError("flush_tma sets the persistent flush; one_launch=True flushes on the "
                         "step's own tiles")
    if not gpu_ok:
        raise ValueError("flush_tma needs an sm_90 or newer GPU (the tensor memory accelerator)")
    problem = tma_layout_problem(data) if data is not None else None
    if problem:
        raise ValueError(problem)
    return True


@triton.jit
def row_head_tile(TILE_FIRST: tl.constexpr):
    """(batch row, head, tile) of a program of a per-(row, head, tile) grid, launched as
    ``step_grid``: (rows, heads, tiles), or (tiles, heads, rows) with TILE_FIRST, so that
    programs launched together walk one cache slot's contiguous state."""
    if TILE_FIRST:
        return tl.program_id(2), tl.program_id(1), tl.program_id(0)
    else:
        return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def tile_rows(vt, N: tl.constexpr, BR: tl.constexpr, WHOLE: tl.constexpr):
    """Rows ``vt * BR + [0, BR)`` of a tile over N rows and their mask. With WHOLE (the
    caller's promise that BR divides N) the mask is a constant, so ptxas need not carry it
    through the tile's loads and stores."""
    rows = vt * BR + tl.arange(0, BR)
    if WHOLE:
        return rows, tl.full((BR,), 1, tl.int1)
    else:
        return rows, rows < N


def step_grid(rows: int, heads: int, tiles: int, tile_first: bool) -> tuple[int, int, int]:
    """The launch grid ``row_head_tile`` reads."""
    return (tiles, heads, rows) if tile_first else (rows, heads, tiles)


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """With PDL: let the next launch in the stream, if it was launched with programmatic
    dependent launch, start now instead of when this grid ends (``griddepcontrol
    .launch_dependents``). Its programs must ``wait_prior_grid`` before they read anything
    this grid writes."""
    if PDL:
        if PTX:
            gdc_launch_dependents()


@triton.jit
def wait_prior_grid(PDL: tl.constexpr):
    """With PDL: block until the previous launch in the stream has finished and its writes
    are visible (``griddepcontrol.wait``). Under the interpreter programs run one launch after
    another, so there is nothing to wait for."""
    if PDL:
        if PTX:
            gdc_wait()


@triton.jit
def prefetch_l2(ptrs, mask):
    """Ask L2 for the lines at ``ptrs`` where ``mask`` holds (``prefetch.global.L2``): no
    register receives them, so a later load of the same lines finds them in L2 without the
    prefetch holding registers meanwhile. Nothing under the interpreter."""
    if PTX:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_records(ptrs, live, n, BR: tl.constexpr):
    """``prefetch_l2`` of the first ``n`` (at most BR) elements after each record pointer of
    ``ptrs`` (LB,) where ``live``: one request per 128-byte line."""
    LINE: tl.constexpr = 1024 // ptrs.dtype.element_ty.primitive_bitwidth
    NSEG: tl.constexpr = (BR + LINE - 1) // LINE
    seg = tl.arange(0, NSEG) * LINE
    prefetch_l2(ptrs[:, None] + seg[None, :], live[:, None] & (seg[None, :] < n))
