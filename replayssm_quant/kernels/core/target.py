"""The device a launch plan is made for: CUDA or the interpreter, compute capability and SM count,
and the named GPUs plans can be printed for without one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch


@dataclass(frozen=True)
class Target:
    """What of the device a plan depends on: CUDA or the interpreter, the compute capability
    (programmatic dependent launch and TMA need sm_90+) and the SM count (the persistent
    flush's grid)."""

    cuda: bool
    capability: tuple[int, int] = (0, 0)
    sms: int = 0
    name: str = "interpreter"

    @classmethod
    def of(cls, device: torch.device | Target) -> Target:
        """The target of a torch device (asks the driver once per device)."""
        if isinstance(device, Target):
            return device
        device = torch.device(device)
        if device.type != "cuda":
            return cls(cuda=False, name=f"{device.type} (interpreter / reference)")
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())

    @property
    def programmatic_launch(self) -> bool:
        """Whether launches can overlap the one before them (``griddepcontrol``, sm_90+)."""
        return self.cuda and self.capability >= (9, 0)

    @property
    def tma(self) -> bool:
        """Whether tensor descriptors can move tiles: sm_90+, or the interpreter (which
        emulates them)."""
        return not self.cuda or self.capability >= (9, 0)


_CUDA_TARGETS: dict[int, Target] = {}


def _cuda_target(index: int) -> Target:
    t = _CUDA_TARGETS.get(index)
    if t is None:
        props = torch.cuda.get_device_properties(index)
        t = Target(True, (props.major, props.minor), props.multi_processor_count, props.name)
        _CUDA_TARGETS[index] = t
    return t


# The GPUs the kernels were tuned on, for plans made without one (``replayssm-quant plan``).
TARGETS: dict[str, Target] = {
    "h200": Target(True, (9, 0), 132, "NVIDIA H200"),
    "h100": Target(True, (9, 0), 132, "NVIDIA H100 SXM"),
    "a100": Target(True, (8, 0), 108, "NVIDIA A100"),
    "interpreter": Target(False),
}


def resolve_target(name: str) -> Target:
    """A named target (``TARGETS``), ``sm_XY[:SMS]`` (e.g. ``sm_90:132``) or ``cuda``: this
    machine's GPU."""
    key = name.strip().lower()
    if key in TARGETS:
        return TARGETS[key]
    if key == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("target 'cuda': no CUDA device on this machine")
        return Target.of(torch.device("cuda"))
    if key.startswith("sm_"):
        cap, _, sms = key[3:].partition(":")
        if cap.isdigit() and len(cap) >= 2 and (not sms or sms.isdigit()):
            return Target(True, (int(cap[:-1]), int(cap[-1])), int(sms or 132), f"sm_{cap}")
    raise ValueError(f"unknown target {name!r}: one of {', '.join(TARGETS)}, cuda (this "
                     "machine's GPU) or sm_XY[:SMS] (e.g. sm_90:132)")


F = TypeVar("F", bound=Callable)


def on_tensor_device(fn: F) -> F:
    """Run a public launcher with the GPU of its first CUDA tensor argument current: Triton
    launches on the current device, so a layer placed on another GPU (a device map) would
    otherwise run on the first one. Costs nothing off CUDA or when that GPU is already current."""

    @functools.wraps(fn)
    def launch(*args, **kwargs):
        t = next((a for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
        if t is None or t.device.index in (None, torch.cuda.current_device()):
            return fn(*args, **kwargs)
        with torch.cuda.device(t.device):
            return fn(*args, **kwargs)

    return launch  # type: ignore[return-value]
