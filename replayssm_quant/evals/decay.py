"""The decay spectrum of a model's SSM heads over the evaluated text.

An eval metric reported beside the drift KL: the drift patch
(:class:`~replayssm_quant.models.patch.ModelPatch`) hands each SSM layer's per-token decay to a
:class:`DecayRecorder`, which keeps per-head sums only (documents merge by adding).
"""

from __future__ import annotations

import torch

__all__ = ["DecayRecorder"]


class DecayRecorder:
    """Mean per-token decay of every SSM head over the evaluated text.

    A head's decay ``a_t`` (Mamba-2: ``exp(dt_t A)``, GDN: ``exp(g_t)``) sets how long rounding
    error in its state lives: shared narrow states hurt long-memory heads (``a`` near 1) most,
    so drift reports show the spectrum beside the KL.
    """

    def __init__(self) -> None:
        self.kinds: dict[int, str] = {}
        self.sums: dict[int, torch.Tensor] = {}
        self.log_sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def add(self, layer: int, kind: str, decay: torch.Tensor) -> None:
        """Accumulate ``decay (B, T, H)``."""
        d = decay.detach().double().flatten(0, -2)
        s, ls = d.sum(0).cpu(), d.clamp_min(1e-300).log().sum(0).cpu()
        if layer in self.sums:
            self.sums[layer] += s
            self.log_sums[layer] += ls
            self.counts[layer] += d.shape[0]
        else:
            self.kinds[layer], self.sums[layer], self.log_sums[layer] = kind, s, ls
            self.counts[layer] = d.shape[0]

    def merge(self, other: DecayRecorder) -> None:
        for layer in other.sums:
            if layer in self.sums:
                self.sums[layer] += other.sums[layer]
                self.log_sums[layer] += other.log_sums[layer]
                self.counts[layer] += other.counts[layer]
            else:
                self.kinds[layer] = other.kinds[layer]
                self.sums[layer] = other.sums[layer].clone()
                self.log_sums[layer] = other.log_sums[layer].clone()
                self.counts[layer] = other.counts[layer]

    def state_dict(self) -> dict:
        return {str(k): {"kind": self.kinds[k], "sum": self.sums[k].tolist(),
                         "log_sum": self.log_sums[k].tolist(), "count": self.counts[k]}
                for k in sorted(self.sums)}

    @classmethod
    def from_state_dict(cls, state: dict) -> DecayRecorder:
        rec = cls()
        for k, v in state.items():
            layer = int(k)
            rec.kinds[layer] = v["kind"]
            rec.sums[layer] = torch.tensor(v["sum"], dtype=torch.float64)
            rec.log_sums[layer] = torch.tensor(v["log_sum"], dtype=torch.float64)
            rec.counts[layer] = int(v["count"])
        return rec

    def spectrum(self, thresholds: tuple[float, ...] = (0.99, 0.999)) -> dict:
        """Per layer and head: mean decay, geometric-mean decay and memory ``1 / (1 - mean)``
        in tokens, plus the fraction of heads at or above each threshold."""
        layers = []
        all_means: list[float] = []
        for layer in sorted(self.sums):
            n = max(self.counts[layer], 1)
            mean = (self.sums[layer] / n).tolist()
            geo = (self.log_sums[layer] / n).exp().tolist()
            all_means += mean
            layers.append({
                "layer": layer, "kind": self.kinds[layer], "tokens": self.counts[layer],
                "mean_decay": mean, "geomean_decay": geo,
                "memory_tokens": [1.0 / max(1.0 - m, 1e-12) for m in mean],
                "max_mean_decay": max(mean) if mean else None,
            })
        frac = {f">={t:g}": (sum(m >= t for m in all_means) / len(all_means) if all_means else 0.0)
                for t in thresholds}
        return {"layers": layers, "heads": len(all_means), "fraction_of_heads": frac,
                "max_mean_decay": max(all_means) if all_means else None}

