"""What the Mamba-2 and GDN kernels share: exact rounding and the Philox stream
(``rounding``), NVFP4 / FP8 codes (``codes``), state row loads and stores (``state_io``),
narrow-state row products (``products``), ring and decay sums (``sums``), cursor and
flush-list bookkeeping (``ring``), the cache layout (``cache``), memory and launch helpers
(``memory``, ``persistent``), the target GPU (``target``) and the emulators' shared parts
(``emulation``). Nothing here imports the per-op folders.
"""
