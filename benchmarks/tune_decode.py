"""Block-size / warp sweep for the decode kernels on one batch size (CUDA), plus a float64
correctness spot check of the FP32 configs at the paper shapes.

    python benchmarks/tune_decode.py --batch 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import Workload, copy_bandwidth, measure  # noqa: E402

from replayssm_quant.precision import PRESETS, SHAPES, step_bytes  # noqa: E402


def check_fp32(shape, cfg, steps: int = 40, batch: int = 4) -> float:
    """Relative error of the kernel against a float64 conventional recurrence."""
    w = Workload(shape, batch, cfg, steps=steps)
    c = w.cache
    S = c.ckpt.data.double()
    H, G = shape.heads, shape.groups
    ys, refs = [], []
    for i in range(steps):
        a = w.inputs[i]
        ys.append(w.step(i).double())
        if shape.kind == "mamba2":
            hg = torch.arange(H, device="cuda") // (H // G)
            Bh, Ch = a["Bm"][:, hg].double(), a["C"][:, hg].double()
            dt = a["dt"].double()
            S = torch.exp(dt * w.A.double())[..., None, None] * S + \
                (dt[..., None] * a["x"].double())[..., None] * Bh[:, :, None, :]
            refs.append((S * Ch[:, :, None, :]).sum(-1) + w.D.double()[:, None] * a["x"].double())
        else:
            hk = torch.arange(H, device="cuda") // (H // G)
            k, q = a["k"][:, hk].double(), a["q"][:, hk].double()
            S = torch.exp(a["g"].double())[..., None, None] * S
            u = a["beta"].double()[..., None] * (a["v"].double() - (S * k[:, :, None, :]).sum(-1))
            S = S + u[..., None] * k[:, :, None, :]
            refs.append((S * q[:, :, None, :]).sum(-1))
    y, r = torch.stack(ys), torch.stack(refs)
    return ((y - r).norm() / r.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shapes", nargs="*", default=["nemotron-3-super-120b", "qwen3.5-4b"])
    ap.add_argument("--configs", nargs="*",
                    default=["fp32", "replay-fp32", "nvfp4-read/fp16-sr", "nvfp4-read/fp32"])
    ap.add_argument("--blocks", type=int, nargs="*", default=[64, 32])
    ap.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--check", action="store_true", help="float64 spot check first")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} copy {bw / 1e12:.3f} TB/s", flush=True)
    for sname in SHAPES if args.check else ():
        for cname in ("fp32", "replay-fp32"):
            t0 = time.time()
            err = check_fp32(SHAPES[sname], PRESETS[cname])
            print(f"check {sname:22s} {cname:12s} rel err vs float64 {err:.2e} "
                  f"({time.time() - t0:.1f}s)", flush=True)
    for sname in args.shapes:
        shape = SHAPES[sname]
        mk = "block_p" if shape.kind == "mamba2" else "block_v"
        fk = "flush_block_p" if shape.kind == "mamba2" else "flush_block_v"
        for cname in args.configs:
            cfg = PRESETS[cname]
            sb = step_bytes(cfg, shape)
            luts = (False, True) if cfg.read_format.name == "nvfp4" else (False,)
            variants = [dict(blk=b, nw=w, lut=lut, fblk=16)
                        for b in args.blocks for w in args.warps for lut in luts]
            if cfg.L > 1:
                variants += [dict(blk=args.blocks[0], nw=4, lut=False, fblk=32)]
            for v in variants:
                t0 = time.time()
                kw = {mk: v["blk"], "num_warps": v["nw"], fk: v["fblk"]}
                if cfg.L > 1:
                    kw["lut"] = v["lut"]
                m = measure(shape, args.batch, cfg, 10, **kw)
                fr = sb.window_average * args.batch / (m["window_us"] * 1e-6) / bw
                frn = sb.nonflush * args.batch / (m["nonflush_us"] * 1e-6) / bw
                frf = sb.flush * args.batch / (m["flush_us"] * 1e-6) / bw
                print(f"{sname:22s} {cname:20s} {v} win {m['window_us']:8.1f}us ({fr:.2f}) "
                      f"nf {m['nonflush_us']:8.1f} ({frn:.2f}) fl {m['flush_us']:8.1f} ({frf:.2f}) "
                      f"[{time.time() - t0:.1f}s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
