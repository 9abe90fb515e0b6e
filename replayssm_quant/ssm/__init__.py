"""Pure-torch reference math of ReplaySSM decoding (Mamba-2 and Gated DeltaNet).

The ground truth that decode kernels, emulators and model adapters are checked against.
Layer-specific steps live in :mod:`.mamba2` and :mod:`.gdn` (same function names in both);
the state container and checkpoint writes in :mod:`.replay`.
"""

from . import gdn, mamba2
from .gdn import GDNState, init_gdn_state
from .mamba2 import Mamba2State, init_mamba2_state
from .replay import ReplayState, load_state, read_checkpoint, read_source, write_checkpoint

__all__ = [
    "GDNState",
    "Mamba2State",
    "ReplayState",
    "gdn",
    "init_gdn_state",
    "init_mamba2_state",
    "load_state",
    "mamba2",
    "read_checkpoint",
    "read_source",
    "write_checkpoint",
]
