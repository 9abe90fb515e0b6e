"""Benchmarks of the decode and emulator kernels, run from the repository root as
``python -m benchmarks.<entry>``:

* ``decode``: the decode-step sweep at the paper shapes (``decode targets``: the speed targets
  over finished sweeps; ``--L 8 16 32 64 --window-only``: the window length per shape,
  ``windows`` writes its table);
* ``tune_decode``: launch-knob sweeps and correctness at the paper shapes (``tune_decode
  variants``: A/B timing of a jobs file of variants, also across two checkouts);
* ``emulate_check``: the whole-sequence emulator kernels against the reference;
* ``vllm_page_graph``: the kernels on the vLLM plugin's pages inside a captured CUDA graph;
* ``generation``: tokens per second of the eval path's ReplaySSM generation against the model's
  own ``generate()`` (CPU or CUDA).

``harness`` holds the timing every entry point shares. The GPU correctness checks are tests:
``python -m pytest -m gpu tests/gpu``.
"""
