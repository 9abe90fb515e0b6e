"""The launch knobs of the decode steps (``StepKnobs``: every knob with its default, built once
where a step is called), their allowed values and their checks, shared by the planner and the
launchers: flush folds and product precisions, programmatic-launch edges, narrow-source
decodes, the verify's product precision and chunking.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from .core.memory import register_cap
from .core.target import Target
from .tuning import DEFAULT_TABLE, Table


class _Default:
    """The type of ``DEFAULT``: a knob left at its default where None is a value (no cap)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()  # a knob left at its default (None is a value: no cap)


FLUSH_FOLDS = ("dot", "records")


FOLD_PRECISIONS = ("ieee", "tf32x3", "bf16x3")


def fold_precision(flush_precision: str | None, ring_dtype: torch.dtype | None = None,
                   default: str = "ieee") -> str:
    """``flush_precision``: the input precision of the flush's matrix products (the ``"dot"``
    fold, GDN's u recompute): ``"ieee"`` (fp32 FMAs), ``"tf32x3"`` (tensor cores, each fp32
    operand as a TF32 head and tail) or ``"bf16x3"`` (tensor cores: the fp32 operand as three
    bf16 pieces against ring vectors that are bf16 already, Mamba-2's B_j and GDN's k_j, so
    every product is exact and only the fp32 accumulation rounds; needs a bf16 ring,
    ``ring_dtype``). None takes ``default`` (``default_fold_precision``)."""
    prec = flush_precision or default
    if prec not in FOLD_PRECISIONS:
        raise ValueError(f"flush_precision must be one of {FOLD_PRECISIONS}, got {flush_precision!r}")
    if prec == "bf16x3" and ring_dtype is not None and ring_dtype != torch.bfloat16:
        raise ValueError(f"flush_precision='bf16x3' needs a bf16 ring (bf16 activations), "
                         f"got {ring_dtype}")
    return prec


def records_fold(flush_fold: str | None) -> bool:
    """``flush_fold``: how a flush folds the window into the checkpoint. ``"dot"`` (default)
    stages the window's records as matrices and folds them with one fp32 ``tl.dot``;
    ``"records"`` adds one rank-1 update per record, newest first, loading each record's
    vectors from the ring (no shared-memory staging, fewer registers)."""
    fold = flush_fold or "dot"
    if fold not in FLUSH_FOLDS:
        raise ValueError(f"flush_fold must be one of {FLUSH_FOLDS}, got {flush_fold!r}")
    return fold == "records"


def check_step_flush(rows: int | None, fold: str | None, one_launch: bool, BP: int, BP2: int,
                     ring_dtype: torch.dtype) -> tuple[int, str]:
    """(rows per pass, fold) of a one-launch program's flush (``step_flush_rows`` /
    ``step_flush_fold``): passes must divide the program's row passes (``BP``, ``BP2``), and
    the ``"dot"`` fold needs 16+ rows (an MMA's least) and a bf16 ring, as the persistent
    flush's bf16x3 products do. Refused without ``one_launch``, where no step program flushes."""
    if rows is None and fold is None:
        return 0, "records"
    if not one_launch:
        raise ValueError("step_flush_rows / step_flush_fold set how a one-launch step's "
                         "programs flush; they need one_launch=True")
    fold = fold or "records"
    if fold not in FLUSH_FOLDS:
        raise ValueError(f"step_flush_fold must be one of {FLUSH_FOLDS}, got {fold!r}")
    rows = rows or (BP if not BP2 else min(BP, BP2))
    if rows <= 0 or rows & (rows - 1) or BP % rows or (BP2 and BP2 % rows):
        raise ValueError(f"step_flush_rows must be a power of two dividing the program's rows "
                         f"({BP}" + (f" + {BP2}" if BP2 else "") + f"), got {rows}")
    if fold == "dot":
        if rows < 16:
            raise ValueError(f"step_flush_fold='dot' needs step_flush_rows >= 16, got {rows}")
        fold_precision("bf16x3", ring_dtype)
    return rows, fold


PDL_EDGES = ("prep", "flush")


def pdl_edges_of(pdl: bool | str | None) -> tuple[str, ...]:
    """The launch edges ``pdl`` makes programmatic: ``"prep"`` (the non-flush launch after
    the ring products), ``"flush"`` (the flush after the non-flush launch), both for
    ``True`` / None."""
    if isinstance(pdl, str):
        if pdl not in PDL_EDGES:
            raise ValueError(f"pdl must be a bool or one of {PDL_EDGES}, got {pdl!r}")
        return (pdl,)
    return PDL_EDGES


def resolve_pdl(pdl: bool | str | None, device: torch.device | Target, *,
                table: Table = DEFAULT_TABLE) -> bool:
    """Whether a ReplaySSM step's launches after its first overlap the launch before them
    (programmatic dependent launch; a string names one edge, ``pdl_edges_of``): by default
    (None) wherever the GPU has it (sm_90+) and its family's ``table`` turns it on; asking for
    it is refused on an older GPU, whose compiler has no ``griddepcontrol``. Under the
    interpreter (CPU tensors) it runs the same kernels, whose waits are no-ops there. A
    one-launch step has no edge to overlap. Only the non-flush programs of non-flushing rows
    release the flush launch: a release in each of a flush step's exiting programs made that
    step slower. Evidence: ``tuning.hopper`` entry ``pdl``."""
    pdl_edges_of(pdl)
    target = Target.of(device)
    if pdl is None:
        return target.programmatic_launch and table["pdl"].value
    if pdl and target.cuda and not target.programmatic_launch:
        raise ValueError("pdl needs an sm_90 or newer GPU (programmatic dependent launch)")
    return bool(pdl)


NVFP4_DECODES = ("e4m3", "words", "mma")


def nvfp4_decode_of(mode: str | None, default: str = "e4m3") -> str:
    """How a Mamba-2 non-flush step decodes its NVFP4 source: ``"e4m3"`` (default: each
    int32 word's nibbles placed into E4M3 bytes, then the hardware's fp8 -> fp16 conversion,
    ``core.codes.e2m1_words_fp16``), ``"words"`` (three integer operations per element into fp32
    bit patterns, ``core.codes.e2m1_word_scaled``) or ``"mma"`` (the E4M3-byte decode times each
    block's scale in fp16, exact, and the state product on tensor cores against C's fp16 pieces
    that the ring-products launch writes, ``core.products.nvfp4_mma_dot``; a step with that
    launch only; not yet timed, so not a default). None takes ``default``, the planner's from
    its table. Evidence: ``tuning.hopper`` entry ``mamba2.nvfp4_decode``."""
    mode = mode or default
    if mode not in NVFP4_DECODES:
        raise ValueError(f"nvfp4_decode must be one of {NVFP4_DECODES}, got {mode!r}")
    return mode


FP8_DECODES = ("cvt", "words")


def fp8_decode_of(mode: str | None, source: str, capacity: int, default: str = "cvt") -> str:
    """How a non-flush step decodes an fp8 read source (the plan's ``decode``; "" for any
    other source): ``"cvt"`` (byte tiles through the hardware's fp8 conversion) or ``"words"``
    (int32 words, three integer operations per element into fp32 bit patterns,
    ``core.codes.e4m3_word_scaled``); None takes ``default``, the planner's from its table
    (the Mamba-2 steps keep ``"cvt"``). Evidence: ``tuning.hopper`` entry ``mamba2.fp8_decode``."""
    mode = mode or default
    if mode not in FP8_DECODES:
        raise ValueError(f"fp8_decode must be one of {FP8_DECODES}, got {mode!r}")
    return "words8" if mode == "words" and capacity and source.startswith("fp8") else ""


DOT_PRECISIONS = ("auto", "bf16x3", "tf32x3", "ieee")


def verify_precision(dot_precision: str, act_dtype: torch.dtype, *,
                     table: Table = DEFAULT_TABLE) -> str:
    """The verify's state product:

    * ``"bf16x3"``: the state as the bf16 pieces that hold its values (``split_dot``: one for
      bf16 / fp8 / NVFP4 states without their row scale, two for fp16, three for fp32) times
      bf16 activations, so every product is exact; the fp32 accumulation still rounds;
    * ``"tf32x3"``: each fp32 operand as a TF32 head and tail, three tensor-core products;
    * ``"ieee"``: fp32 FMAs, 2-4x slower;
    * ``"auto"`` (default): the table's choice, ``bf16x3`` for bf16 activations, else ``tf32x3``.
    Evidence: ``tuning.hopper`` entry ``verify.dot_precision``."""
    if dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"dot_precision must be one of {DOT_PRECISIONS}, got {dot_precision!r}")
    bf16 = act_dtype == torch.bfloat16
    if dot_precision == "auto":
        return table["verify.dot_precision"].value["bf16" if bf16 else "other"]
    if dot_precision == "bf16x3" and not bf16:
        raise ValueError(f"dot_precision='bf16x3' needs bf16 activations, got {act_dtype}")
    return dot_precision


def split_terms(fmt_code: int) -> int:
    """bf16 pieces that hold a stored state value exactly (row scale aside): 3 for fp32, 2 for
    fp16, 1 for bf16 / fp8 / NVFP4."""
    return {0: 3, 1: 2}.get(fmt_code, 1)


def verify_chunk(n: int, chunk: int) -> int:
    """Inner-dimension chunk of the verify's fp32 products: the largest power of two up to
    ``chunk`` that divides n (at least 16, the smallest ``tl.dot`` operand)."""
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    if n % 16:
        raise ValueError(f"the speculative verify needs a state width divisible by 16, got {n}")
    while n % chunk:
        chunk //= 2
    return chunk


def check_prep_groups(prep_groups: int | None, groups: int, what: str) -> None:
    """Refuse a ``prep_groups`` that is not a power of two dividing the layer's ``what``."""
    if prep_groups is not None and (prep_groups < 1 or prep_groups & (prep_groups - 1)
                                    or groups % prep_groups):
        raise ValueError(f"prep_groups must be a power of two dividing the {what} ({groups}), "
                         f"got {prep_groups}")


GDN_NVFP4_DECODES = ("words", "lut", "mma")


def gdn_nvfp4_decode_of(mode: str | None, lut: bool, default: str = "words") -> str:
    """How a GDN non-flush step decodes an NVFP4 source: ``"words"`` (default; int32 words into
    fp32 bit patterns, ``core.codes.e2m1_word_scaled``, two FMAs per element for S k and S q),
    ``"lut"`` with ``lut=True`` (a 16-entry table), or ``"mma"`` (tensor-core products against
    the fp16 pieces of k and q the ring-products launch writes, ``core.products.nvfp4_mma_dot``;
    a step with that launch only). Mamba-2's E4M3-byte decode is not offered: the decoded tile
    held for both products made the step slower. None takes ``default``, the planner's from its
    table. Evidence: ``tuning.hopper`` entry ``gdn.nvfp4_decode``."""
    if lut:
        if mode not in (None, "lut"):
            raise ValueError(f"lut=True decodes NVFP4 through a table; nvfp4_decode={mode!r} "
                             "asks for another decode")
        return "lut"
    mode = mode or default
    if mode not in GDN_NVFP4_DECODES:
        raise ValueError(f"nvfp4_decode must be one of {GDN_NVFP4_DECODES}, got {mode!r}")
    return mode


def check_ut_tile(ut: bool, precision: str, rows: int, warps: int) -> None:
    """Refuse the one flush tile known to fault: the UT-transform flush (``flush_fold="dot"``
    with a read copy) with TF32x3 products on 64+ rows and 8+ warps (two warp groups) hits an
    illegal memory access on the H200 with Triton 3.6, which poisons the CUDA context; 32
    rows, 4 warps, the ``"ieee"`` products and the flush without a read copy all run
    (located in commit 9444d84)."""
    if ut and precision == "tf32x3" and rows >= 64 and warps >= 8:
        raise ValueError(
            f"flush_precision='tf32x3' with the UT-transform flush on {rows}-row tiles and "
            f"{warps} warps faults on the GPU (Triton 3.6); use flush_warps=4, "
            "flush_block_v=32 or flush_precision='ieee'")


@dataclass(frozen=True)
class StepKnobs:
    """The launch knobs of a decode step, every one at its default unless given: the keyword
    arguments of ``mamba2_decode_step`` / ``gdn_decode_step`` and ``plan.step_plan`` as one
    value, built once where a step is called (``StepKnobs.of``) and read by the planner.
    None (and ``DEFAULT`` for the register caps, where None means no cap) leaves a choice to
    the planner; the values that need no layer, batch or GPU to check are checked here, the
    rest where the plan is made. ``Mamba2Knobs`` / ``GdnKnobs`` add each kind's own names."""

    advance: bool = True
    num_warps: int | None = None
    flush_warps: int | None = None
    flush_per_sm: int | None = None
    lut: bool = False
    flush_stages: int | None = None
    flush_fold: str | None = None
    flush_precision: str | None = None
    tile_first: bool | None = None
    fuse_advance: bool = True
    fuse_prep: bool | None = None
    maxnreg: int | None | object = DEFAULT
    flush_maxnreg: int | None | object = DEFAULT
    one_launch: bool | None = None
    pdl: bool | str | None = None
    prep_groups: int | None = None
    flush_tma: bool | None = None
    fp8_decode: str | None = None
    nvfp4_decode: str | None = None
    step_flush_rows: int | None = None
    step_flush_fold: str | None = None

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        register_cap(self.step_maxnreg)
        register_cap(self.given_flush_maxnreg)

    @staticmethod
    def of(kind: str, **knobs: Any) -> StepKnobs:
        """The knobs of a ``kind`` ("mamba2" / "gdn") step from keyword arguments; a name
        the step does not take is refused, as a misspelt knob must not pass silently."""
        cls = KNOBS_OF_KIND.get(kind)
        if cls is None:
            raise ValueError(f"unknown layer kind {kind!r}; expected one of {tuple(KNOBS_OF_KIND)}")
        names = {f.name for f in fields(cls)}
        unknown = [name for name in knobs if name not in names]
        if unknown:
            raise TypeError(f"{kind}_step_plan() got an unexpected keyword argument '{unknown[0]}' "
                            f"(unknown launch knob(s) {', '.join(unknown)}; the knobs are the "
                            f"fields of {cls.__name__})")
        return cls(**knobs)

    @property
    def step_maxnreg(self) -> int | None:
        """The step programs' register cap as given (None: none given, or no cap)."""
        return None if self.maxnreg is DEFAULT else self.maxnreg

    @property
    def given_flush_maxnreg(self) -> int | None:
        """The flush programs' register cap as given (None: none given, or no cap)."""
        return None if self.flush_maxnreg is DEFAULT else self.flush_maxnreg

    @property
    def flush_block(self) -> int | None:
        """Rows per tile of the persistent flush (``flush_block_p`` / ``flush_block_v``)."""
        raise NotImplementedError

    def persistent_flush_knobs(self) -> tuple:
        """The knobs that ask for the persistent flush launch; any of them set turns the
        one-launch default off (``tuning.rules.resolve_one_launch``)."""
        return (self.flush_block, self.flush_warps, self.flush_per_sm, self.flush_stages,
                self.flush_fold, self.flush_precision, self.given_flush_maxnreg,
                self.flush_tma or None)


@dataclass(frozen=True)
class Mamba2Knobs(StepKnobs):
    """``StepKnobs`` of a Mamba-2 step: tiles of head-dim rows (``block_p``,
    ``flush_block_p``), whole-head programs (``whole_head``) and early loads (default
    ``early_loads_default``)."""

    block_p: int | None = None
    flush_block_p: int | None = None
    whole_head: bool | None = None
    early_loads: bool | None = None

    kind: ClassVar[str] = "mamba2"

    def __post_init__(self) -> None:
        super().__post_init__()
        nvfp4_decode_of(self.nvfp4_decode)
        pdl_edges_of(self.pdl)

    @property
    def flush_block(self) -> int | None:
        return self.flush_block_p


@dataclass(frozen=True)
class GdnKnobs(StepKnobs):
    """``StepKnobs`` of a GDN step: tiles of value rows (``block_v``, ``flush_block_v``);
    early loads off unless asked for."""

    block_v: int | None = None
    flush_block_v: int | None = None
    early_loads: bool = False

    kind: ClassVar[str] = "gdn"

    def __post_init__(self) -> None:
        super().__post_init__()
        gdn_nvfp4_decode_of(self.nvfp4_decode, self.lut)
        pdl_edges_of(self.pdl)

    @property
    def flush_block(self) -> int | None:
        return self.flush_block_v


KNOBS_OF_KIND: dict[str, type[StepKnobs]] = {"mamba2": Mamba2Knobs, "gdn": GdnKnobs}
