"""How fast a read-only decode step can go on this GPU: a ReplaySSM non-flush step reads the
state once and writes almost nothing, so its ceiling is the read bandwidth of row mat-vecs
over a state-sized tensor, not the copy bandwidth that the conventional step (read + write)
is measured against. Times, in one run with the copy bandwidth:

* ``torch``: ``S @ c`` (cuBLAS GEMV) over the whole tensor;
* ``grid``: one Triton program per tile of ``rows`` state rows, ``warps`` warps, each row
  dotted with its group's vector (the non-flush step's state product without its ring);
* ``persistent``: one wave of programs walking the tiles in a loop software-pipelined over
  ``stages`` (the next tiles' loads issued while this one reduces), as the flush kernels do;
* ``step``: the grid's product laid out as Nemotron-3-Super's non-flush step (128 heads of 64
  rows per batch row), with ``chain`` its slot and cursor loaded before the state, with
  ``ring`` 7 of 16 bf16 ring records added: what each costs a read-only step.

    python benchmarks/read_bandwidth.py --rows 2097152 --out reports/kernels/read_bw

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

STEP_H, STEP_P = 128, 64  # the step mocks' heads and head dim (Nemotron-3-Super)


@triton.jit
def _tile_dot(S_ptr, c_ptr, y_ptr, t, GROUP_ROWS: tl.constexpr, BR: tl.constexpr,
              N: tl.constexpr):
    rows = t * BR + tl.arange(0, BR)
    n = tl.arange(0, N)
    S = tl.load(S_ptr + rows[:, None] * N + n[None, :])
    c = tl.load(c_ptr + (t * BR // GROUP_ROWS) * N + n)
    tl.store(y_ptr + rows, tl.sum(S * c[None, :], axis=1))


@triton.jit
def _rowdot_grid(S_ptr, c_ptr, y_ptr, GROUP_ROWS: tl.constexpr, BR: tl.constexpr,
                 N: tl.constexpr):
    """y[r] = S[r] . c[r // GROUP_ROWS], one tile of BR rows per program."""
    _tile_dot(S_ptr, c_ptr, y_ptr, tl.program_id(0), GROUP_ROWS, BR, N)


@triton.jit
def _rowdot_persistent(S_ptr, c_ptr, y_ptr, ntiles, GROUP_ROWS: tl.constexpr,
                       BR: tl.constexpr, N: tl.constexpr, STAGES: tl.constexpr):
    """The same products, the programs walking the tiles in a pipelined loop."""
    for t in tl.range(tl.program_id(0), ntiles, tl.num_programs(0), num_stages=STAGES):
        _tile_dot(S_ptr, c_ptr, y_ptr, t, GROUP_ROWS, BR, N)


@triton.jit
def _rowdot_step(S_ptr, c_ptr, y_ptr, slots_ptr, cur_ptr, xr_ptr, w_ptr, H: tl.constexpr,
                 P: tl.constexpr, GROUP_ROWS: tl.constexpr, BR: tl.constexpr, N: tl.constexpr,
                 CAP: tl.constexpr, L: tl.constexpr, CHAIN: tl.constexpr, RING: tl.constexpr):
    """The tile product as a non-flush step forms it: with CHAIN the state's slot comes from
    ``slots[b]`` and the product is skipped unless the slot's cursor says the row does not
    flush (two dependent loads before the state load can start); with RING the row also
    adds its ring's weighted x records (``c`` of CAP bf16 records of the tile's rows)."""
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
        S = tl.load(S_ptr + (slot * H * P + rows[:, None]) * N + n[None, :])
        cv = tl.load(c_ptr + ((b * H * P + h * P) // GROUP_ROWS) * N + n)
        y = tl.sum(S * cv[None, :], axis=1)
        if RING:
            j = tl.arange(0, CAP)
            xr = tl.load(xr_ptr + (slot * H * CAP + h * CAP + j[:, None]) * P + p[None, :],
                         mask=(j < c)[:, None], other=0.0).to(tl.float32)
            w = tl.load(w_ptr + (b * H + h) * CAP + j, mask=j < c, other=0.0)
            y += tl.sum(w[:, None] * xr, axis=0)
        tl.store(y_ptr + b * H * P + rows, y)


def variants(args) -> list[tuple[str, dict]]:
    out = [("torch", {})]
    out += [("grid", {"rows": r, "warps": w}) for r in args.grid_rows for w in args.warps]
    out += [("persistent", {"rows": r, "warps": w, "stages": s, "per_sm": p})
            for r in args.persistent_rows for w in args.warps for s in args.stages
            for p in args.per_sm]
    out += [("step", {"rows": r, "warps": 1, "chain": ch, "ring": rg})
            for r in args.step_rows for ch in (False, True) for rg in (False, True)]
    return out


def runner(kind: str, knobs: dict, S, c, y, group_rows: int, sms: int):
    """A no-argument callable that runs one variant into ``y``, and what its output adds to
    the grouped product (None: the product with ``c[0]`` for every row instead)."""
    R, N = S.shape
    if kind == "torch":  # one vector for every row: cuBLAS's plain GEMV
        return lambda: torch.mv(S, c[0], out=y), None
    BR, W = knobs["rows"], knobs["warps"]
    ntiles = R // BR
    if kind == "step":
        H, P, CAP = STEP_H, STEP_P, 16
        B = R // (H * P)
        slots = torch.arange(B, device=S.device, dtype=torch.int32)
        cur = torch.full((B,), 7, device=S.device, dtype=torch.int32)
        xr = torch.randn(B, H, CAP, P, device=S.device).to(torch.bfloat16)
        w = torch.rand(B, H, CAP, device=S.device)
        ring = (w[:, :, :7, None].double() * xr[:, :, :7].double()).sum(2).reshape(-1)
        fn = lambda: _rowdot_step[(R // BR,)](  # noqa: E731
            S, c, y, slots, cur, xr, w, H=H, P=P, GROUP_ROWS=group_rows, BR=BR, N=N, CAP=CAP,
            L=16, CHAIN=knobs["chain"], RING=knobs["ring"], num_warps=W)
        return fn, ring if knobs["ring"] else 0.0
    if kind == "grid":
        return lambda: _rowdot_grid[(ntiles,)](S, c, y, GROUP_ROWS=group_rows, BR=BR, N=N,
                                              num_warps=W), 0.0
    grid = (min(ntiles, sms * knobs["per_sm"]),)
    return lambda: _rowdot_persistent[grid](S, c, y, ntiles, GROUP_ROWS=group_rows, BR=BR, N=N,
                                            STAGES=knobs["stages"], num_warps=W), 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256 * 128 * 64,
                    help="state rows (default: Nemotron-3-Super's Mamba-2 state at batch 256)")
    ap.add_argument("--d", type=int, default=128, help="row length (d_state / d_k)")
    ap.add_argument("--group-rows", type=int, default=1024,
                    help="rows sharing one vector (Super: 16 heads x 64 rows per group)")
    ap.add_argument("--grid-rows", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--persistent-rows", type=int, nargs="*", default=[32, 64])
    ap.add_argument("--warps", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--stages", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--per-sm", type=int, nargs="*", default=[4, 8, 16])
    ap.add_argument("--step-rows", type=int, nargs="*", default=[32, 64],
                    help="tile rows of the non-flush step mocks (Super's layout: --rows a "
                         f"multiple of {STEP_H * STEP_P})")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write OUT.md with the table")
    args = ap.parse_args(argv)
    if args.rows % args.group_rows or args.group_rows % max(args.grid_rows + args.persistent_rows
                                                            + args.step_rows):
        raise SystemExit("--rows must be a multiple of --group-rows, which must be one of the "
                         "largest tile")
    if args.step_rows and (args.rows % (STEP_H * STEP_P) or STEP_P % max(args.step_rows)):
        raise SystemExit(f"the step mocks need --rows a multiple of {STEP_H * STEP_P} and tiles "
                         f"of at most {STEP_P} rows")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    S = torch.randn(args.rows, args.d, device=dev)
    c = torch.randn(args.rows // args.group_rows, args.d, device=dev)
    want = (S.double().view(-1, args.group_rows, args.d)
            @ c.double()[:, :, None]).reshape(-1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 1
    copy = copy_bandwidth() if dev == "cuda" else float("nan")
    nbytes = S.numel() * 4
    lines = [f"Copy bandwidth {copy / 1e12:.3f} TB/s (read + write); state {nbytes / 1e9:.3f} GB "
             f"fp32, rows of {args.d}, one vector per {args.group_rows} rows.", "",
             "| variant | knobs | us | read TB/s | x copy |", "| --- | --- | ---: | ---: | ---: |"]
    print("\n".join(lines), flush=True)
    for kind, knobs in variants(args):
        y = torch.full((args.rows,), float("nan"), device=dev)
        fn, extra = runner(kind, knobs, S, c, y, args.group_rows, sms)
        fn()
        ref = want + extra if extra is not None else S.double() @ c[0].double()
        err = ((y.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
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
