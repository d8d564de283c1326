"""Set-up for bench's own suite (`python -m pytest bench/tests`): the studies' plans, their runs end to end on tiny
presets, and the committed reports rebuilt from their records. It runs beside the library's suite in CI."""

import os
import sys
from pathlib import Path

# Set before transformers / huggingface_hub are imported: without it a Hub-style load waits minutes for network
# time-outs on machines without internet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import torch  # noqa: E402

# `bench` is a folder of the repository, not part of the installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# The studies' models are tiny: one intra-op thread is faster than two on a shared 2-core machine.
torch.set_num_threads(1)
