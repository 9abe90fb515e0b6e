"""How fast a read-only decode step can go on this GPU: a ReplaySSM non-flush step reads the
state once and writes almost nothing, so its ceiling is the read bandwidth of row mat-vecs
over a state-sized tensor, not the copy bandwidth that the conventional step (read + write)
is measured against. Times, in one run with the copy bandwidth:

* ``torch``: ``S @ c`` (cuBLAS GEMV) over the whole tensor;
* ``grid``: one Triton program per tile of ``rows`` state rows, ``warps`` warps, each row
  dotted with its group's vector (the non-flush step's state product without its ring);
* ``persistent``: one wave of programs walking the tiles in a loop software-pipelined over
  ``stages`` (the next tiles' loads issued while this one reduces), as the flush kernels do;
* ``step``: the grid's product laid out as a non-flush step, with ``chain`` its slot and
  cursor loaded before the state, with ``ring`` 7 of 16 ring records added: what each costs
  a read-only step. The records lie as the ring keeps them (``rows``: record-major, each
  record a head's rows) or, with ``--ring-layouts tiles``, tile-major (a tile's records
  contiguous), which no kernel uses: what the layout costs. ``--step-layout mamba2`` is
  Nemotron-3-Super's (128 heads of 64 rows per batch row, bf16 x records), ``gdn``
  Qwen3.5-4B's (32 value heads of 128 rows, fp32 u records, as the GDN ring keeps them).

``--vectors 2`` dots every row with two vectors, as GDN's non-flush step forms S k and S q
in one pass (``torch`` is then left out: cuBLAS has no two-vector GEMV).

    python benchmarks/read_bandwidth.py --rows 2097152 --out reports/kernels/read_bw
    python benchmarks/read_bandwidth.py --rows 1048576 --group-rows 256 --vectors 2 \
        --step-layout gdn --out reports/kernels/read_bw_gdn

Every variant's output is checked against a float64 product first. Prints a Markdown table
(time, read TB/s, fraction of the copy bandwidth) and writes it with ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode import copy_bandwidth, time_graph  # noqa: E402

from replayssm_quant.kernels.common import prefetch_l2  # noqa: E402

# the step mocks' (heads, rows per head, ring record dtype) per layout
STEP_LAYOUTS = {"mamba2": (128, 64, torch.bfloat16), "gdn": (32, 128, torch.float32)}
RING_LAYOUTS = ("rows", "tiles")  # record-major (as the ring keeps them), tile-major
# where a step mock loads its ring records: after the state products (as the GDN kernel),
# loaded and summed before the state loads, loaded before them and summed after, or after
# the products with their lines asked of L2 before the state loads
RING_ORDERS = ("after", "before", "loads-first", "prefetch")


@triton.jit
def _tile_dot(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, t, GROUP_ROWS: tl.constexpr,
              BR: tl.constexpr, N: tl.constexpr, TWO: tl.constexpr):
    rows = t * BR + tl.arange(0, BR)
    n = tl.arange(0, N)
    S = tl.load(S_ptr + rows[:, None] * N + n[None, :])
    c = tl.load(c_ptr + (t * BR // GROUP_ROWS) * N + n)
    tl.store(y_ptr + rows, tl.sum(S * c[None, :], axis=1))
    if TWO:
        c2 = tl.load(c2_ptr + (t * BR // GROUP_ROWS) * N + n)
        tl.store(y2_ptr + rows, tl.sum(S * c2[None, :], axis=1))


@triton.jit
def _rowdot_grid(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, GROUP_ROWS: tl.constexpr,
                 BR: tl.constexpr, N: tl.constexpr, TWO: tl.constexpr):
    """y[r] = S[r] . c[r // GROUP_ROWS] (and y2 with c2 when TWO), one tile of BR rows per
    program."""
    _tile_dot(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, tl.program_id(0), GROUP_ROWS, BR, N, TWO)


@triton.jit
def _rowdot_persistent(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, ntiles, GROUP_ROWS: tl.constexpr,
                       BR: tl.constexpr, N: tl.constexpr, STAGES: tl.constexpr,
                       TWO: tl.constexpr):
    """The same products, the programs walking the tiles in a pipelined loop."""
    for t in tl.range(tl.program_id(0), ntiles, tl.num_programs(0), num_stages=STAGES):
        _tile_dot(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, t, GROUP_ROWS, BR, N, TWO)


@triton.jit
def _ring_sum(xr_ptr, w_ptr, slot, b, h, t, p, c, H: tl.constexpr, P: tl.constexpr,
              BR: tl.constexpr, CAP: tl.constexpr, RING: tl.constexpr):
    """The ring's records (record-major with RING 1, tile-major with RING 2) and weights."""
    TILES: tl.constexpr = P // BR
    j = tl.arange(0, CAP)
    if RING == 2:  # tile-major: (slot, head, tile, record, tile row)
        rp = xr_ptr + ((slot * H + h) * TILES + t) * CAP * BR + j[:, None] * BR \
            + tl.arange(0, BR)[None, :]
    else:
        rp = xr_ptr + (slot * H * CAP + h * CAP + j[:, None]) * P + p[None, :]
    xr = tl.load(rp, mask=(j < c)[:, None], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + (b * H + h) * CAP + j, mask=j < c, other=0.0)
    return xr, w


@triton.jit
def _rowdot_step(S_ptr, c_ptr, y_ptr, c2_ptr, y2_ptr, slots_ptr, cur_ptr, xr_ptr, w_ptr,
                 H: tl.constexpr, P: tl.constexpr, GROUP_ROWS: tl.constexpr, BR: tl.constexpr,
                 N: tl.constexpr, CAP: tl.constexpr, L: tl.constexpr, CHAIN: tl.constexpr,
                 RING: tl.constexpr, TWO: tl.constexpr, ORDER: tl.constexpr = 0):
    """The tile product as a non-flush step forms it: with CHAIN the state's slot comes from
    ``slots[b]`` and the product is skipped unless the slot's cursor says the row does not
    flush (two dependent loads before the state load can start); with RING the row also
    adds its ring's weighted records (``c`` of CAP records of the tile's rows; with TWO to
    both products, as GDN's u records enter both w and o), laid out record-major (RING 1)
    or tile-major (RING 2). ORDER places the records' loads in the program: 0 after the
    state's products (as the GDN kernel's ring records), 1 loaded and summed before the
    state's loads, 2 loaded before them and summed after the products, 3 as 0 with each
    record's line of the tile prefetched to L2 before the state's loads."""
    TILES: tl.constexpr = P // BR
    pid = tl.program_id(0)
    t, h, b = pid % TILES, (pid // TILES) % H, pid // (TILES * H)
    p = t * BR + tl.arange(0, BR)
    n = tl.arange(0, N)
    rows = h * P + p
    if CHAIN:
        slot = tl.load(slots_ptr + b)
        c = tl.load(cur_ptr + slot)
    else:
        slot = b
        c = L // 2 - 1  # the cursor the chained variant loads
    if c != L - 1:
        if RING and ORDER == 3:  # each record's line of this tile asked of L2 first
            jp = tl.arange(0, CAP)
            if RING == 2:
                pp = xr_ptr + (((slot * H + h) * TILES + t) * CAP + jp) * BR
            else:
                pp = xr_ptr + (slot * H * CAP + h * CAP + jp) * P + t * BR
            prefetch_l2(pp, jp < c)
        if RING and (ORDER == 1 or ORDER == 2):
            xr, w = _ring_sum(xr_ptr, w_ptr, slot, b, h, t, p, c, H, P, BR, CAP, RING)
            if ORDER == 1:
                r = tl.sum(w[:, None] * xr, axis=0)
        S = tl.load(S_ptr + (slot * H * P + rows[:, None]) * N + n[None, :])
        g = (b * H * P + h * P) // GROUP_ROWS
        cv = tl.load(c_ptr + g * N + n)
        y = tl.sum(S * cv[None, :], axis=1)
        if TWO:
            y2 = tl.sum(S * tl.load(c2_ptr + g * N + n)[None, :], axis=1)
        if RING:
            if ORDER == 0 or ORDER == 3:
                xr, w = _ring_sum(xr_ptr, w_ptr, slot, b, h, t, p, c, H, P, BR, CAP, RING)
            if ORDER != 1:
                r = tl.sum(w[:, None] * xr, axis=0)
            y += r
            if TWO:
                y2 += r
        tl.store(y_ptr + b * H * P + rows, y)
        if TWO:
            tl.store(y2_ptr + b * H * P + rows, y2)


def variants(args) -> list[tuple[str, dict]]:
    out = [("torch", {})] if args.vectors == 1 else []
    out += [("grid", {"rows": r, "warps": w}) for r in args.grid_rows for w in args.warps]
    out += [("persistent", {"rows": r, "warps": w, "stages": s, "per_sm": p})
            for r in args.persistent_rows for w in args.warps for s in args.stages
            for p in args.per_sm]
    out += [("step", {"rows": r, "warps": 1, "chain": ch, "ring": False})
            for r in args.step_rows for ch in (False, True)]
    out += [("step", {"rows": r, "warps": 1, "chain": ch, "ring": rg, "order": o})
            for r in args.step_rows for ch in (False, True) for rg in args.ring_layouts
            for o in args.ring_orders]
    return out


def runner(kind: str, knobs: dict, S, c, y, group_rows: int, sms: int, layout: str):
    """A no-argument callable that runs one variant into ``y`` (one row per vector of ``c``),
    and what its ring adds to each grouped product (None: the product with ``c[0, 0]`` for
    every row instead)."""
    R, N = S.shape
    two = c.shape[0] == 2
    c2, y2 = (c[1], y[1]) if two else (c[0], y[0])
    if kind == "torch":  # one vector for every row: cuBLAS's plain GEMV
        return lambda: torch.mv(S, c[0, 0], out=y[0]), None
    BR, W = knobs["rows"], knobs["warps"]
    ntiles = R // BR
    if kind == "step":
        (H, P, rdtype), CAP = STEP_LAYOUTS[layout], 16
        B = R // (H * P)
        slots = torch.arange(B, device=S.device, dtype=torch.int32)
        cur = torch.full((B,), 7, device=S.device, dtype=torch.int32)
        xr = torch.randn(B, H, CAP, P, device=S.device).to(rdtype)
        w = torch.rand(B, H, CAP, device=S.device)
        ring = (w[:, :, :7, None].double() * xr[:, :, :7].double()).sum(2).reshape(-1)
        code = {False: 0, "rows": 1, "tiles": 2}[knobs["ring"]]
        if code == 2:  # the same records, each tile's contiguous
            xr = xr.view(B, H, CAP, P // BR, BR).permute(0, 1, 3, 2, 4).contiguous()
        fn = lambda: _rowdot_step[(R // BR,)](  # noqa: E731
            S, c[0], y[0], c2, y2, slots, cur, xr, w, H=H, P=P, GROUP_ROWS=group_rows, BR=BR,
            N=N, CAP=CAP, L=16, CHAIN=knobs["chain"], RING=code, TWO=two,
            ORDER=RING_ORDERS.index(knobs.get("order", "after")),
            num_warps=W)
        return fn, ring if knobs["ring"] else 0.0
    if kind == "grid":
        return lambda: _rowdot_grid[(ntiles,)](S, c[0], y[0], c2, y2, GROUP_ROWS=group_rows,
                                              BR=BR, N=N, TWO=two, num_warps=W), 0.0
    grid = (min(ntiles, sms * knobs["per_sm"]),)
    return lambda: _rowdot_persistent[grid](S, c[0], y[0], c2, y2, ntiles, GROUP_ROWS=group_rows,
                                            BR=BR, N=N, STAGES=knobs["stages"], TWO=two,
                                            num_warps=W), 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256 * 128 * 64,
                    help="state rows (default: Nemotron-3-Super's Mamba-2 state at batch 256)")
    ap.add_argument("--d", type=int, default=128, help="row length (d_state / d_k)")
    ap.add_argument("--group-rows", type=int, default=1024,
                    help="rows sharing one vector (Super: 16 heads x 64 rows per group; "
                         "Qwen3.5-4B: 2 value heads x 128 rows per key head)")
    ap.add_argument("--vectors", type=int, choices=(1, 2), default=1,
                    help="vectors each row is dotted with (GDN: 2, S k and S q)")
    ap.add_argument("--grid-rows", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--persistent-rows", type=int, nargs="*", default=[32, 64])
    ap.add_argument("--warps", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--stages", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--per-sm", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--step-layout", choices=list(STEP_LAYOUTS), default="mamba2",
                    help="heads, rows and ring records of the step mocks")
    ap.add_argument("--step-rows", type=int, nargs="*", default=[32, 64],
                    help="tile rows of the non-flush step mocks (--rows a multiple of the "
                         "layout's heads x rows)")
    ap.add_argument("--ring-layouts", nargs="+", choices=RING_LAYOUTS, default=["rows"],
                    help="ring record layouts of the step mocks with a ring (rows: as the ring "
                         "keeps them; tiles: each tile's records contiguous)")
    ap.add_argument("--ring-orders", nargs="+", choices=RING_ORDERS, default=["after"],
                    help="where the step mocks with a ring load its records (after: once the "
                         "state's products are formed, as the GDN kernel; before: loaded and "
                         "summed before the state's loads; loads-first: loaded before them, "
                         "summed after the products; prefetch: as after, with their lines "
                         "asked of L2 before the state's loads)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write OUT.md with the table")
    args = ap.parse_args(argv)
    if args.rows % args.group_rows or args.group_rows % max(args.grid_rows + args.persistent_rows
                                                            + args.step_rows):
        raise SystemExit("--rows must be a multiple of --group-rows, which must be one of the "
                         "largest tile")
    H, P, _ = STEP_LAYOUTS[args.step_layout]
    if args.step_rows and (args.rows % (H * P) or P % max(args.step_rows)):
        raise SystemExit(f"the {args.step_layout} step mocks need --rows a multiple of {H * P} "
                         f"and tiles of at most {P} rows")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    S = torch.randn(args.rows, args.d, device=dev)
    c = torch.randn(args.vectors, args.rows // args.group_rows, args.d, device=dev)
    want = (S.double().view(1, -1, args.group_rows, args.d)
            @ c.double()[:, :, :, None]).reshape(args.vectors, -1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 1
    copy = copy_bandwidth() if dev == "cuda" else float("nan")
    nbytes = S.numel() * 4
    lines = [f"Copy bandwidth {copy / 1e12:.3f} TB/s (read + write); state {nbytes / 1e9:.3f} GB "
             f"fp32, rows of {args.d}, {args.vectors} vector(s) per {args.group_rows} rows; "
             f"step mocks in the {args.step_layout} layout.", "",
             "| variant | knobs | us | read TB/s | x copy |", "| --- | --- | ---: | ---: | ---: |"]
    print("\n".join(lines), flush=True)
    for kind, knobs in variants(args):
        y = torch.full((args.vectors, args.rows), float("nan"), device=dev)
        fn, extra = runner(kind, knobs, S, c, y, args.group_rows, sms, args.step_layout)
        fn()
        ref = want + extra if extra is not None else (S.double() @ c[0, 0].double())[None]
        got = y if extra is not None else y[:1]
        err = ((got.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
        if not err < 1e-4:  # NaN fails too
            raise SystemExit(f"{kind} {knobs}: max error {err:.2e} against float64")
        t = time_graph(fn, reps=args.reps, repeat=16)
        line = (f"| {kind} | {knobs or ''} | {t * 1e6:.1f} | {nbytes / t / 1e12:.3f} | "
                f"{nbytes / t / copy:.3f} |")
        lines.append(line)
        print(line, flush=True)
    if args.out:
        Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
