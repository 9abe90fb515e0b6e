"""PrecisionConfig: the one description of a state-precision choice, its string form, presets,
and the state-bytes cost model that the recommender ranks configs by.

String form (used by the CLI, reports and the vLLM plugin): ``ckpt=<fmt>[:rn|sr],read=<fmt>|none,L=<int>``,
e.g. ``ckpt=fp32,read=nvfp4,L=16`` or ``ckpt=fp8:sr,read=nvfp4,L=16``. ``L=1`` with ``read=none``
is conventional decoding (the state is read and written every step).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .formats import ROUNDINGS, Format, canonical_format

__all__ = [
    "PRESETS",
    "SHAPES",
    "ModelShape",
    "PrecisionConfig",
    "StepBytes",
    "WINDOW_LENGTHS",
    "best_window_by_bytes",
    "parse_config",
    "split_configs",
    "resolve_shape",
    "step_bytes",
    "window_bytes",
    "window_family",
    "window_name",
    "window_optimum",
    "with_window",
]

CKPT_FORMATS = ("fp32", "fp16", "bf16", "fp8e4m3", "nvfp4")
READ_FORMATS = ("fp32", "fp16", "bf16", "fp8e4m3", "nvfp4")
MAX_L = 256


@dataclass(frozen=True)
class PrecisionConfig:
    """How one SSM layer stores and reads its state during decode.

    ckpt: format of the high-precision checkpoint that carries the recurrence.
    ckpt_rounding: ``rn`` or ``sr`` for writing a narrow checkpoint.
    read: format of the read copy made at each flush, or None (non-flush steps read the
        checkpoint itself: the "shared" configs when the checkpoint is narrow).
    L: flush interval (ring length); 1 means conventional decoding.
    prefill: how prompt tokens are processed; only ``exact`` (FP32 chunked scan) exists.
    """

    ckpt: Format
    ckpt_rounding: str = "rn"
    read: Format | None = None
    L: int = 1
    prefill: str = "exact"
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.ckpt.name not in CKPT_FORMATS:
            raise ValueError(
                f"checkpoint format {self.ckpt.name!r} is not supported; use one of {CKPT_FORMATS}"
            )
        if self.ckpt_rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {self.ckpt_rounding!r}; use one of {ROUNDINGS}")
        if self.ckpt.name == "fp32" and self.ckpt_rounding == "sr":
            raise ValueError("ckpt=fp32:sr makes no sense: FP32 is the compute precision")
        if self.read is not None and self.read.name not in READ_FORMATS:
            raise ValueError(f"read format {self.read.name!r} is not supported; use one of "
                             f"{READ_FORMATS} or none")
        if isinstance(self.L, bool) or not isinstance(self.L, int):
            raise ValueError(f"L must be an integer, got {self.L!r}")
        if self.L < 1:
            raise ValueError(f"L must be >= 1, got {self.L}")
        if self.L > MAX_L:
            raise ValueError(f"L must be <= {MAX_L}, got {self.L}")
        if self.read is not None and self.L == 1:
            raise ValueError("a read copy needs L > 1: with L=1 every step is a flush and "
                             "reads the checkpoint")
        if self.prefill != "exact":
            raise ValueError(f"prefill must be 'exact', got {self.prefill!r}")

    # ------------------------------------------------------------------ properties
    @property
    def conventional(self) -> bool:
        return self.L == 1

    @property
    def read_format(self) -> Format:
        """The format non-flush steps read: the read copy, else the checkpoint."""
        return self.read if self.read is not None else self.ckpt

    @property
    def uses_sr(self) -> bool:
        return self.ckpt_rounding == "sr"

    @property
    def recompute_u(self) -> bool:
        """GDN: the flush recomputes u from the checkpoint when non-flush steps read a copy."""
        return self.read is not None

    # ------------------------------------------------------------------ string form
    def __str__(self) -> str:
        ck = self.ckpt.name + (":sr" if self.ckpt_rounding == "sr" else "")
        rd = self.read.name if self.read is not None else "none"
        return f"ckpt={_short(ck)},read={_short(rd)},L={self.L}"

    @property
    def label(self) -> str:
        """Preset name when it has one, else the string form."""
        return self.name or str(self)

    def to_dict(self) -> dict:
        return {"config": str(self), "name": self.name, "ckpt": self.ckpt.name,
                "ckpt_rounding": self.ckpt_rounding,
                "read": self.read.name if self.read else None, "L": self.L}


def _short(name: str) -> str:
    return name.replace("fp8e4m3", "fp8")


_KEYS = ("ckpt", "read", "L", "prefill")


def parse_config(text: str | PrecisionConfig) -> PrecisionConfig:
    """Parse a preset name or ``key=value`` string; one clear error per mistake."""
    if isinstance(text, PrecisionConfig):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty precision config; give a preset name or e.g. "
                         "'ckpt=fp32,read=nvfp4,L=16'")
    s = text.strip()
    if s in PRESETS:
        return PRESETS[s]
    if "=" not in s:
        raise ValueError(f"unknown preset {s!r}; presets: {', '.join(PRESETS)}; or give "
                         "'ckpt=<fmt>[:sr],read=<fmt>|none,L=<int>'")
    parts: dict[str, str] = {}
    for item in s.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty field in precision config {s!r}")
        if item.count("=") != 1:
            raise ValueError(f"field {item!r} in {s!r} is not key=value")
        k, v = (p.strip() for p in item.split("="))
        key = {"l": "L"}.get(k.lower(), k.lower())
        if key not in _KEYS:
            raise ValueError(f"unknown key {k!r} in {s!r}; keys: {', '.join(_KEYS)}")
        if key in parts:
            raise ValueError(f"key {key!r} given twice in {s!r}")
        parts[key] = v
    if "ckpt" not in parts:
        raise ValueError(f"precision config {s!r} has no ckpt=<format>")
    ck = parts["ckpt"]
    rounding = "rn"
    if ":" in ck:
        ck, rounding = (p.strip().lower() for p in ck.split(":", 1))
        if rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {rounding!r} in {s!r}; use one of {ROUNDINGS}")
    ckpt = canonical_format(ck)
    read_s = parts.get("read", "none").strip().lower()
    if ":" in read_s:
        raise ValueError(f"read copies are always rounded to nearest; drop the suffix in "
                         f"'read={parts['read']}'")
    read = None if read_s in ("none", "") else canonical_format(read_s)
    if read is not None and read.name == ckpt.name and ckpt.name == "fp32":
        raise ValueError("read=fp32 with ckpt=fp32 duplicates the checkpoint; use read=none")
    l_s = parts.get("L", "1")
    if not re.fullmatch(r"[+-]?\d+", l_s):
        raise ValueError(f"L must be an integer, got {l_s!r}")
    cfg = PrecisionConfig(ckpt=ckpt, ckpt_rounding=rounding, read=read, L=int(l_s),
                          prefill=parts.get("prefill", "exact"))
    for preset in PRESETS.values():
        if preset == cfg:
            return preset
    return cfg


def split_configs(values: list[str]) -> list[str]:
    """Command-line config arguments to config strings: each value may hold several configs
    separated by commas, spaces or semicolons; the ``read=``/``L=``/``prefill=`` fields that
    follow a ``ckpt=`` belong to it (``shared-nvfp4,ckpt=fp8:sr,read=nvfp4,L=16`` is two
    configs); ``all`` stands for every preset."""
    out: list[str] = []
    for value in values:
        for tok in (t for t in re.split(r"[,;\s]+", value) if t):
            key = tok.split("=", 1)[0].strip().lower() if "=" in tok else None
            if key in ("read", "l", "prefill") and out and out[-1].lower().startswith("ckpt="):
                out[-1] = f"{out[-1]},{tok}"
            elif tok.lower() == "all":
                out.extend(PRESETS)
            else:
                out.append(tok)
    return list(dict.fromkeys(out))


def _preset(name: str, text: str) -> PrecisionConfig:
    cfg = parse_config(text)
    return PrecisionConfig(cfg.ckpt, cfg.ckpt_rounding, cfg.read, cfg.L, cfg.prefill, name=name)


PRESETS: dict[str, PrecisionConfig] = {}
for _name, _text in [
    ("fp32", "ckpt=fp32,read=none,L=1"),
    ("replay-fp32", "ckpt=fp32,read=none,L=16"),
    ("shared-fp8", "ckpt=fp8,read=none,L=16"),
    ("shared-nvfp4", "ckpt=nvfp4,read=none,L=16"),
    ("nvfp4-read/fp32", "ckpt=fp32,read=nvfp4,L=16"),
    ("nvfp4-read/fp16-sr", "ckpt=fp16:sr,read=nvfp4,L=16"),
    ("nvfp4-read/fp8-sr", "ckpt=fp8:sr,read=nvfp4,L=16"),
    ("fp8-read/fp32", "ckpt=fp32,read=fp8,L=16"),
    ("fp16-sr", "ckpt=fp16:sr,read=none,L=1"),
    ("bf16-sr", "ckpt=bf16:sr,read=none,L=1"),
]:
    PRESETS[_name] = _preset(_name, _text)


# ---------------------------------------------------------------------------------- cost model
@dataclass(frozen=True)
class ModelShape:
    """One SSM layer's decode shape (per tensor-parallel rank).

    mamba2: ``heads`` x ``head_dim`` (P) x ``d_state`` (N), ``groups`` B/C groups.
    gdn: ``heads`` value heads x ``head_dim`` (d_v) x ``d_state`` (d_k), ``groups`` key heads.
    """

    name: str
    kind: str
    heads: int
    head_dim: int
    d_state: int
    groups: int
    layers: int | None = None
    act_bytes: int = 2

    def __post_init__(self) -> None:
        if self.kind not in ("mamba2", "gdn"):
            raise ValueError(f"shape kind must be 'mamba2' or 'gdn', got {self.kind!r}")
        if self.heads % self.groups:
            raise ValueError(f"{self.name}: heads ({self.heads}) must be a multiple of "
                             f"groups ({self.groups})")

    @property
    def rows(self) -> int:
        return self.heads * self.head_dim

    def record_bytes(self, cfg: PrecisionConfig) -> int:
        """Bytes of one ring record (one token) for this layer."""
        a = self.act_bytes
        if self.kind == "mamba2":  # x (act), dt (fp32), B (act)
            return self.heads * self.head_dim * a + self.heads * 4 + self.groups * self.d_state * a
        rec = self.groups * self.d_state * a + self.heads * self.head_dim * 4 + self.heads * 4
        if cfg.recompute_u:  # v (act) and beta (fp32) so the flush can recompute u
            rec += self.heads * self.head_dim * a + self.heads * 4
        return rec


SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape("nemotron-3-nano-4b", "mamba2", 96, 80, 128, 8),
        ModelShape("nemotron-3-super-120b", "mamba2", 128, 64, 128, 8),
        ModelShape("qwen3.5-4b", "gdn", 32, 128, 128, 16),
        ModelShape("qwen3.5-122b-a10b", "gdn", 64, 128, 128, 16),
    )
}
_SHAPE_ALIASES = {"nemotron-3-nano": "nemotron-3-nano-4b", "nemotron-3-super": "nemotron-3-super-120b",
                  "qwen3.5-122b": "qwen3.5-122b-a10b"}


def resolve_shape(name: str) -> ModelShape:
    key = _SHAPE_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; built-in shapes: "
                         f"{', '.join(list(SHAPES) + list(_SHAPE_ALIASES))}")
    return SHAPES[key]


@dataclass(frozen=True)
class StepBytes:
    """State bytes one layer moves per decode step for one sequence."""

    nonflush: float
    flush: float
    window_average: float
    state_bytes: float  # bytes held per sequence: checkpoint + read copy + ring


def step_bytes(cfg: PrecisionConfig, shape: ModelShape) -> StepBytes:
    """Bytes read + written per step, averaged over a window of L steps.

    Conventional (L=1): read and write the checkpoint. ReplaySSM, step k of a window
    (k = 1..L): a non-flush step reads the read source (read copy, else checkpoint) and the
    k-1 buffered records, and appends its own record; the flush (k = L) reads the checkpoint
    and the L-1 records, writes the checkpoint and the read copy. The flush's own token comes
    from the step inputs, so it is never written to the ring.
    """
    n = shape.d_state
    rows = shape.rows
    ck = rows * cfg.ckpt.row_bytes(n)
    rd = rows * cfg.read.row_bytes(n) if cfg.read is not None else 0.0
    if cfg.L == 1:
        return StepBytes(nonflush=2 * ck, flush=2 * ck, window_average=2 * ck, state_bytes=ck)
    rec = shape.record_bytes(cfg)
    src = rd if cfg.read is not None else ck
    L = cfg.L
    nonflush_total = sum(src + (k - 1) * rec + rec for k in range(1, L))
    flush = ck + (L - 1) * rec + ck + rd
    avg = (nonflush_total + flush) / L
    nonflush_avg = nonflush_total / (L - 1)
    return StepBytes(nonflush=nonflush_avg, flush=flush, window_average=avg,
                     state_bytes=ck + rd + L * rec)


# ------------------------------------------------------------------------- window length (L)
WINDOW_LENGTHS = (8, 16, 32, 64)  # the flush intervals the cost model and the benchmark compare


def with_window(cfg: PrecisionConfig, L: int) -> PrecisionConfig:
    """``cfg`` with flush interval ``L``: the preset when one matches, else an unnamed config,
    so a result at another L never carries the preset's name."""
    if cfg.L == 1:
        raise ValueError(f"{cfg.label} is a conventional step: it has no window to lengthen")
    c = PrecisionConfig(cfg.ckpt, cfg.ckpt_rounding, cfg.read, L, cfg.prefill)
    return next((p for p in PRESETS.values() if p == c), c)


def window_family(cfg: PrecisionConfig) -> str:
    """The config string without its L: what every window length of one precision split
    shares (``ckpt=fp16:sr,read=nvfp4``)."""
    return str(cfg).rsplit(",L=", 1)[0]


def window_name(cfg: PrecisionConfig) -> str:
    """The name of ``cfg``'s family: the preset with the same formats and a window (at its
    own L), else the family string."""
    fam = window_family(cfg)
    return next((p.label for p in PRESETS.values() if p.L > 1 and window_family(p) == fam), fam)


def window_bytes(cfg: PrecisionConfig, shape: ModelShape,
                 lengths=WINDOW_LENGTHS) -> dict[int, StepBytes]:
    """``step_bytes`` of ``cfg`` at each window length: ring reads grow with L (step k reads
    k-1 records), the flush's checkpoint write and read-copy write spread over L steps."""
    return {L: step_bytes(with_window(cfg, L), shape) for L in lengths}


def best_window_by_bytes(cfg: PrecisionConfig, shape: ModelShape, lengths=WINDOW_LENGTHS) -> int:
    """The L of ``lengths`` with the fewest window-average bytes per step (the smaller on a tie)."""
    wb = window_bytes(cfg, shape, lengths)
    return min(wb, key=lambda L: (wb[L].window_average, L))


def window_optimum(cfg: PrecisionConfig, shape: ModelShape) -> float:
    """The real L that minimises ``step_bytes``' window average. Per step the average is
    ``src + rec + rec (L-1)/2 + (2 ck + rd - src - rec) / L`` (read source, ring record,
    checkpoint, read copy), so the optimum is ``sqrt(2 (2 ck + rd - src - rec) / rec)``: the
    flush's fixed bytes against the ring's growing reads."""
    if cfg.L == 1:
        raise ValueError(f"{cfg.label} is a conventional step: it has no window")
    n = shape.d_state
    ck = shape.rows * cfg.ckpt.row_bytes(n)
    rd = shape.rows * cfg.read.row_bytes(n) if cfg.read is not None else 0.0
    src = rd if cfg.read is not None else ck
    rec = shape.record_bytes(cfg)
    return math.sqrt(max(0.0, 2 * (2 * ck + rd - src - rec) / rec))
