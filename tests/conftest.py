"""Shared test set-up: offline Hub, tiny model configs and the location of the shared data files."""

import os

# Set before transformers / huggingface_hub are imported: without it a Hub-style load waits minutes for
# network time-outs on machines without internet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hf_layertie import TiedBertConfig, TiedGPT2Config  # noqa: E402

# The test models are tiny: one intra-op thread is several times faster than two on a shared 2-core
# machine, where spinning worker threads compete with the other processes.
torch.set_num_threads(1)

# CI runs a fresh clone of the repository with `../shared` beside it.
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

# Model sizes without the number of blocks (each config class spells that field differently).
TINY_GPT2 = dict(n_embd=16, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
TINY_BERT = dict(
    hidden_size=16,
    num_attention_heads=2,
    intermediate_size=32,
    vocab_size=100,
    max_position_embeddings=32,
    pad_token_id=0,
)


def make_tiny_gpt2_config(tying_map=None, num_blocks: int | None = None, **overrides) -> TiedGPT2Config:
    """A GPT-2 small enough to build, save and load in milliseconds; `num_blocks` defaults to the map's length."""
    num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
    return TiedGPT2Config(n_layer=num_blocks, **{**TINY_GPT2, **overrides}, tying_map=tying_map)


def make_tiny_bert_config(tying_map=None, num_blocks: int | None = None, **overrides) -> TiedBertConfig:
    """A BERT small enough to build, save and load in milliseconds; `num_blocks` defaults to the map's length."""
    num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
    return TiedBertConfig(num_hidden_layers=num_blocks, **{**TINY_BERT, **overrides}, tying_map=tying_map)


@pytest.fixture(scope="session")
def tiny_gpt2_config():
    """Factory `tiny_gpt2_config(tying_map, **overrides)` (session-scoped so hypothesis tests may use it)."""
    return make_tiny_gpt2_config


@pytest.fixture(scope="session")
def tiny_bert_config():
    """Factory `tiny_bert_config(tying_map, **overrides)` (session-scoped so hypothesis tests may use it)."""
    return make_tiny_bert_config


@st.composite
def raw_tying_maps(draw, min_blocks: int = 3, max_blocks: int = 6) -> list[int]:
    """Valid maps as a user may write them: entry i is any block <= i, so chains (3 -> 2 -> 0) occur."""
    num_blocks = draw(st.integers(min_blocks, max_blocks))
    return [0] + [draw(st.integers(0, index)) for index in range(1, num_blocks)]
