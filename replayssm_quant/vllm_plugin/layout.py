"""The one description of a vLLM cache page with the precision split, per SSM layer and slot.

vLLM 0.33 keeps one page per cache slot (block) per layer and cuts it into views in the order of
``get_state_shape``: Mamba-2 ``(conv, ssm[, x_ring, dt_ring, B_ring])`` (the rings only with
``--use-replayssm``), GDN ``(conv, ssm)``. The plugin keeps that order (the metadata builder and
the conv kernels address the stock entries by position), stores the **checkpoint** in place of
``ssm`` and appends one int8 **tail** that holds everything vLLM does not know about: row and block
scales, the read copy, and the GDN ring. Inside the tail every tensor starts on a 16-byte
boundary, so the views are aligned whatever the stock entries weigh.

The layer's ``get_state_shape``/``get_state_dtype``, the model class's
``get_mamba_state_{shape,dtype}_from_config`` and ``replayssm-quant configs --vllm-page`` all call
:func:`extend_page`; nothing else computes page sizes, so the layer page and the class page cannot
disagree. This module imports no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import prod

import torch

from ..precision import PRESETS, ModelShape, PrecisionConfig, parse_config, resolve_shape

__all__ = [
    "ALIGN",
    "PageLayout",
    "Part",
    "extend_page",
    "stock_page",
    "vllm_page",
    "vllm_page_table",
    "with_buffer_len",
]

ALIGN = 16
"""Byte alignment of every tensor in the tail and of the whole page."""

_DATA_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "fp8e4m3": torch.float8_e4m3fn, "nvfp4": torch.uint8}
# What vLLM is told about the checkpoint slot: the real dtype for IEEE formats, bytes otherwise
# (vLLM indexes this tensor with torch.where on prefill rows, which FP8 tensors do not support).
_DECLARED_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                   "fp8e4m3": torch.uint8, "nvfp4": torch.uint8}


def _round_up(n: int, m: int = ALIGN) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Part:
    """One tensor of a slot: ``shape`` per slot in ``dtype`` at ``offset`` bytes from the page
    start. ``name`` is ``conv``, ``ckpt.data``, ``ckpt.row_scale``, ``ckpt.block_scale``,
    ``read.*`` or ``ring.<x|dt|B|k|u|g|v|beta>``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class PageLayout:
    """A slot's page: what vLLM is told (``shapes``, ``dtypes``) and where every tensor lives.

    ``shapes``/``dtypes`` are the stock entries (the checkpoint in place of ``ssm``) plus one
    ``(tail_bytes,)`` int8 entry when the tail is not empty. ``parts`` lists every tensor the
    plugin addresses, stock ones included, with its real dtype.
    """

    kind: str
    config: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    parts: tuple[Part, ...]
    capacity: int
    n_stock: int

    @property
    def page_bytes(self) -> int:
        """Bytes per slot before vLLM pads the page to the attention page size."""
        return sum(prod(s) * d.itemsize for s, d in zip(self.shapes, self.dtypes, strict=True))

    @property
    def tail_bytes(self) -> int:
        return prod(self.shapes[-1]) if len(self.shapes) > self.n_stock else 0

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"page has no tensor {name!r}; it has {[p.name for p in self.parts]}")

    def has(self, name: str) -> bool:
        return any(p.name == name for p in self.parts)

    def bytes_by_role(self) -> dict[str, int]:
        """Bytes per slot grouped as conv / ckpt / read / ring / padding (for tables)."""
        out = {"conv": 0, "ckpt": 0, "read": 0, "ring": 0}
        for p in self.parts:
            out[p.name.split(".")[0]] += p.nbytes
        out["padding"] = self.page_bytes - sum(out.values())
        return out


def _state_parts(prefix: str, fmt: str, heads: int, rows: int, d: int) -> list[tuple]:
    """(name, shape, dtype) of a stored state: data, then row and block scales if any."""
    if fmt == "nvfp4":
        return [(f"{prefix}.data", (heads, rows, d // 2), torch.uint8),
                (f"{prefix}.row_scale", (heads, rows), torch.float32),
                (f"{prefix}.block_scale", (heads, rows, d // 16), torch.float8_e4m3fn)]
    out = [(f"{prefix}.data", (heads, rows, d), _DATA_DTYPE[fmt])]
    if fmt == "fp8e4m3":
        out.append((f"{prefix}.row_scale", (heads, rows), torch.float32))
    return out


def _check_row_length(cfg: PrecisionConfig, kind: str, d: int) -> None:
    what = "d_state" if kind == "mamba2" else "d_k (linear_key_head_dim)"
    for role, fmt in (("checkpoint", cfg.ckpt), ("read copy", cfg.read)):
        if fmt is not None and fmt.block and d % 32:
            raise ValueError(
                f"{what}={d} does not fit NVFP4: the {role} stores rows in blocks of 16 along "
                f"{what} packed two values per byte, so {what} must be a multiple of 32")
    if d < 32 or d & (d - 1):
        raise ValueError(f"the decode kernels need {what} to be a power of two >= 32, got {d}")


def extend_page(kind: str, cfg: PrecisionConfig | str, stock_shapes, stock_dtypes, *,
                groups: int, act_dtype: torch.dtype) -> PageLayout:
    """The plugin's page for one layer, from vLLM's stock entries for that layer (per TP rank).

    ``stock_shapes``/``stock_dtypes``: what the in-tree layer returns. Mamba-2: ``conv, ssm``
    plus the ``x, dt, B`` rings when the config replays (``L > 1``, ``--use-replayssm``); their
    length must be ``L``. GDN: ``conv, ssm``. ``ssm`` is ``(heads, rows, d)``: ``(H, P, N)`` or
    ``(Hv, V, K)``. ``groups``: B/C groups (Mamba-2) or key heads (GDN) on this rank;
    ``act_dtype``: the model's activation dtype (ring records).
    """
    cfg = parse_config(cfg)
    if kind not in ("mamba2", "gdn"):
        raise ValueError(f"kind must be 'mamba2' or 'gdn', got {kind!r}")
    stock_shapes = [tuple(int(v) for v in s) for s in stock_shapes]
    stock_dtypes = list(stock_dtypes)
    if len(stock_shapes) != len(stock_dtypes):
        raise ValueError("stock shapes and dtypes differ in length")
    heads, rows, d = stock_shapes[1]
    _check_row_length(cfg, kind, d)
    replay = cfg.L > 1
    n_stock = 5 if (kind == "mamba2" and replay) else 2
    if len(stock_shapes) != n_stock:
        if kind == "mamba2" and replay:
            raise ValueError(f"config {cfg} replays (L={cfg.L}) but the stock Mamba-2 page has "
                             f"no ReplaySSM rings: serve with --use-replayssm")
        raise ValueError(f"expected {n_stock} stock {kind} state tensors, got {len(stock_shapes)}")
    if kind == "mamba2" and replay:
        ring_len = stock_shapes[2][1]
        if ring_len != cfg.L:
            raise ValueError(f"the stock ring holds {ring_len} records but the config has "
                             f"L={cfg.L}; L comes from --replayssm-buffer-len")

    ck = _state_parts("ckpt", cfg.ckpt.name, heads, rows, d)
    names_shapes = [("conv", stock_shapes[0], stock_dtypes[0], stock_dtypes[0]),
                    ("ckpt.data", ck[0][1], ck[0][2], _DECLARED_DTYPE[cfg.ckpt.name])]
    if n_stock == 5:
        for name, i in (("ring.x", 2), ("ring.dt", 3), ("ring.B", 4)):
            names_shapes.append((name, stock_shapes[i], stock_dtypes[i], stock_dtypes[i]))

    parts: list[Part] = []
    offset = 0
    for name, shape, real, declared in names_shapes:
        parts.append(Part(name, shape, real, offset))
        offset += prod(shape) * declared.itemsize
    stock_end = offset

    tail: list[tuple] = [p for p in ck[1:] if p[2] == torch.float32]
    rd = _state_parts("read", cfg.read.name, heads, rows, d) if cfg.read is not None else []
    tail += [p for p in rd[1:] if p[2] == torch.float32]
    if kind == "gdn" and replay:
        cap = cfg.L
        tail += [("ring.u", (heads, cap, rows), torch.float32),
                 ("ring.g", (heads, cap), torch.float32)]
        if cfg.recompute_u:
            tail.append(("ring.beta", (heads, cap), torch.float32))
        tail.append(("ring.k", (groups, cap, d), act_dtype))
        if cfg.recompute_u:
            tail.append(("ring.v", (heads, cap, rows), act_dtype))
    tail += rd[:1]
    tail += [p for p in ck[1:] if p[2] != torch.float32]
    tail += [p for p in rd[1:] if p[2] != torch.float32]

    offset = _round_up(stock_end)
    for name, shape, dtype in tail:
        parts.append(Part(name, shape, dtype, offset))
        offset = _round_up(offset + prod(shape) * dtype.itemsize)
    total = _round_up(max(offset, stock_end))
    shapes = [s for _, s, _, _ in names_shapes]
    dtypes = [dec for _, _, _, dec in names_shapes]
    if total > stock_end:
        shapes.append((total - stock_end,))
        dtypes.append(torch.int8)
    for p in parts:
        if p.offset % p.dtype.itemsize:
            raise ValueError(f"{p.name} would start at byte {p.offset}, not a multiple of its "
                             f"{p.dtype.itemsize}-byte elements; the stock entries before it "
                             f"are misaligned")
    return PageLayout(kind, str(cfg), tuple(shapes), tuple(dtypes), tuple(parts),
                      cfg.L if replay else 0, n_stock)


# ---------------------------------------------------------------------------------- no-vLLM side
def stock_page(shape: ModelShape, cfg: PrecisionConfig, *, tp: int = 1, conv_kernel: int = 4,
               act_dtype: torch.dtype = torch.bfloat16, ssm_dtype: torch.dtype = torch.float32
               ) -> tuple[list[tuple[int, ...]], list[torch.dtype]]:
    """vLLM 0.33's stock entries for a layer of ``shape`` (conv state in the default SD layout),
    with the Mamba-2 rings when ``cfg`` replays. Mirrors ``MambaStateShapeCalculator``; the
    vLLM tests check the two agree."""
    H, P, N, G = shape.heads, shape.head_dim, shape.d_state, shape.groups
    if H % tp:
        raise ValueError(f"{shape.name}: {H} heads do not split over TP={tp}")
    if shape.kind == "mamba2":
        g_all = G + (0 if G % tp == 0 else tp - G)
        conv_dim = H * P + 2 * g_all * N
        shapes = [(conv_kernel - 1, conv_dim // tp), (H // tp, P, N)]
        dtypes = [act_dtype, ssm_dtype]
        if cfg.L > 1:
            shapes += [(H // tp, cfg.L, P), (H // tp, cfg.L), (g_all // tp, cfg.L, N)]
            dtypes += [act_dtype, torch.float32, act_dtype]
        return shapes, dtypes
    if G % tp:
        raise ValueError(f"{shape.name}: {G} key heads do not split over TP={tp}")
    conv_dim = 2 * G * N + H * P
    return [(conv_kernel - 1, conv_dim // tp), (H // tp, P, N)], [act_dtype, ssm_dtype]


def vllm_page(shape: ModelShape | str, cfg: PrecisionConfig | str, *, tp: int = 1,
              act_dtype: torch.dtype = torch.bfloat16) -> PageLayout:
    """The plugin's page for one layer of a named shape (no vLLM needed)."""
    shape = resolve_shape(shape) if isinstance(shape, str) else shape
    cfg = parse_config(cfg)
    shapes, dtypes = stock_page(shape, cfg, tp=tp, act_dtype=act_dtype)
    groups = shapes[4][0] if len(shapes) == 5 else shape.groups // tp
    return extend_page(shape.kind, cfg, shapes, dtypes, groups=groups, act_dtype=act_dtype)


def vllm_page_table(shape: ModelShape | str, extra: Sequence[PrecisionConfig | str] | None = None, *,
                    tp: int = 1) -> list[dict]:
    """One row per preset (plus ``extra`` configs): bytes one request holds in vLLM's cache for
    one SSM layer of ``shape`` (per TP rank, before vLLM pads the page to the attention page
    size), broken down by role, and the ratio to vLLM's stock FP32 page."""
    shape = resolve_shape(shape) if isinstance(shape, str) else shape
    stock_s, stock_d = stock_page(shape, PRESETS["fp32"], tp=tp)
    stock = sum(prod(s) * d.itemsize for s, d in zip(stock_s, stock_d, strict=True))
    rows = []
    for cfg in list(PRESETS.values()) + [parse_config(c) for c in (extra or [])]:
        page = vllm_page(shape, cfg, tp=tp)
        roles = page.bytes_by_role()
        rows.append({
            "name": cfg.label, "config": str(cfg), "shape": shape.name, "tp": tp,
            "page_bytes": page.page_bytes, "conv_bytes": roles["conv"],
            "ckpt_bytes": roles["ckpt"], "read_bytes": roles["read"],
            "ring_bytes": roles["ring"], "padding_bytes": roles["padding"],
            "stock_fp32_page_bytes": stock, "vs_stock_fp32": page.page_bytes / stock,
        })
    return rows


def with_buffer_len(cfg: PrecisionConfig, L: int) -> PrecisionConfig:
    """``cfg`` with its flush interval replaced (vLLM's ``--replayssm-buffer-len``)."""
    return replace(cfg, L=L, name=None) if cfg.L != L else cfg
