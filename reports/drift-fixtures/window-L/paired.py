"""Paired KL differences between window lengths of one split, per position bucket: the
per-token KL of L=32 / L=64 minus L=16 on the same tokens, averaged over 128-token blocks
(the blocks' spread gives the standard error, so nearby tokens' correlation is respected)."""
import glob
import sys

import numpy as np
import pandas as pd

root = sys.argv[1]
BUCKETS = [(128, 1024), (1024, 4096), (4096, 8192)]
FAMS = {"nvfp4-read/fp32": ("nvfp4-read_fp32-", "ckpt_fp32_read_nvfp4_L_{L}-"),
        "nvfp4-read/fp16-sr": ("nvfp4-read_fp16-sr-", "ckpt_fp16_sr_read_nvfp4_L_{L}-"),
        "nvfp4-read/fp8-sr": ("nvfp4-read_fp8-sr-", "ckpt_fp8_sr_read_nvfp4_L_{L}-"),
        "fp8-read/fp32": ("fp8-read_fp32-", "ckpt_fp32_read_fp8_L_{L}-")}


def load(prefix):
    f = glob.glob(f"{root}/pairs/*/{prefix}*.parquet")
    return pd.read_parquet(f[0]).set_index("pos") if f else None


for fam, (p16, pL) in FAMS.items():
    a = load(p16)
    if a is None:
        continue
    for L in (32, 64):
        b = load(pL.format(L=L))
        if b is None:
            continue
        cells = []
        for lo, hi in BUCKETS:
            x = a.loc[(a.index >= lo) & (a.index < hi), "kl"]
            y = b.loc[x.index, "kl"]
            d = (y - x).to_numpy()
            n = len(d) // 128 * 128
            blocks = d[:n].reshape(-1, 128).mean(1)
            se = blocks.std(ddof=1) / np.sqrt(len(blocks))
            cells.append(f"[{lo},{hi}) {y.mean() / x.mean():.3f}x "
                         f"(diff {d.mean():+.2e} +- {1.96 * se:.1e})")
        print(f"{fam:20s} L={L:2d} vs 16: " + "; ".join(cells))
