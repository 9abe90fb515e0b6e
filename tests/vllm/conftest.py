"""The vLLM plugin tests run in a venv with vllm==0.33.0 (see docs/vllm.md); elsewhere every
test module here skips. vLLM must see a CPU target before it is imported."""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
sys.path.insert(0, os.path.dirname(__file__))
