"""Shared test set-up: offline Hub, tiny model configs, every tied model class, the shared data files."""

import os

# Set before transformers / huggingface_hub are imported: without it a Hub-style load waits minutes for
# network time-outs on machines without internet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from hf_layertie import (  # noqa: E402
    TiedBertConfig,
    TiedBertForMaskedLM,
    TiedGPT2Config,
    TiedGPT2LMHeadModel,
    TiedLlamaConfig,
    TiedLlamaForCausalLM,
    TiedMistralConfig,
    TiedMistralForCausalLM,
    TiedQwen2Config,
    TiedQwen2ForCausalLM,
)

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

# Llama-family decoders: grouped-query attention (4 query heads share 2 key/value heads). The Qwen2 model slides
# a 4-token window from layer 2 on and the Mistral one everywhere, so that tied layers mix attention types.
TINY_LLAMA = dict(
    hidden_size=16,
    intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)
TINY_QWEN2 = dict(TINY_LLAMA, use_sliding_window=True, sliding_window=4, max_window_layers=2)
TINY_MISTRAL = dict(TINY_LLAMA, sliding_window=4)


def _tiny_decoder_config(config_class, sizes):
    def make(tying_map=None, num_blocks: int | None = None, **overrides):
        num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
        return config_class(num_hidden_layers=num_blocks, **{**sizes, **overrides}, tying_map=tying_map)

    make.__doc__ = f"A {config_class.__name__} small enough to build, save and load in milliseconds."
    return make


make_tiny_llama_config = _tiny_decoder_config(TiedLlamaConfig, TINY_LLAMA)
make_tiny_qwen2_config = _tiny_decoder_config(TiedQwen2Config, TINY_QWEN2)
make_tiny_mistral_config = _tiny_decoder_config(TiedMistralConfig, TINY_MISTRAL)


def make_tiny_gpt2_config(tying_map=None, num_blocks: int | None = None, **overrides) -> TiedGPT2Config:
    """A GPT-2 small enough to build, save and load in milliseconds; `num_blocks` defaults to the map's length."""
    num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
    return TiedGPT2Config(n_layer=num_blocks, **{**TINY_GPT2, **overrides}, tying_map=tying_map)


def make_tiny_bert_config(tying_map=None, num_blocks: int | None = None, **overrides) -> TiedBertConfig:
    """A BERT small enough to build, save and load in milliseconds; `num_blocks` defaults to the map's length."""
    num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
    return TiedBertConfig(num_hidden_layers=num_blocks, **{**TINY_BERT, **overrides}, tying_map=tying_map)


@dataclass(frozen=True)
class ModelKind:
    """One tied model class with everything the shared tests need to build, compare and reload it."""

    name: str
    tied_class: type[PreTrainedModel]
    make_config: Callable
    plain_class: type[PreTrainedModel]
    plain_config: Callable[[int], object]
    auto_class: type
    blocks_path: str

    @property
    def causal(self) -> bool:
        return self.auto_class is AutoModelForCausalLM

    def tied_model(self, tying_map, seed: int = 0, **overrides) -> PreTrainedModel:
        torch.manual_seed(seed)
        return self.tied_class(self.make_config(tying_map, **overrides)).eval()

    def plain_model(self, num_blocks: int, seed: int = 0) -> PreTrainedModel:
        torch.manual_seed(seed)
        return self.plain_class(self.plain_config(num_blocks)).eval()


GPT2 = ModelKind(
    "gpt2",
    TiedGPT2LMHeadModel,
    make_tiny_gpt2_config,
    GPT2LMHeadModel,
    lambda num_blocks: GPT2Config(n_layer=num_blocks, **TINY_GPT2),
    AutoModelForCausalLM,
    "transformer.h",
)
BERT = ModelKind(
    "bert",
    TiedBertForMaskedLM,
    make_tiny_bert_config,
    BertForMaskedLM,
    lambda num_blocks: BertConfig(num_hidden_layers=num_blocks, **TINY_BERT),
    AutoModelForMaskedLM,
    "bert.encoder.layer",
)
LLAMA = ModelKind(
    "llama",
    TiedLlamaForCausalLM,
    make_tiny_llama_config,
    LlamaForCausalLM,
    lambda num_blocks: LlamaConfig(num_hidden_layers=num_blocks, **TINY_LLAMA),
    AutoModelForCausalLM,
    "model.layers",
)
QWEN2 = ModelKind(
    "qwen2",
    TiedQwen2ForCausalLM,
    make_tiny_qwen2_config,
    Qwen2ForCausalLM,
    lambda num_blocks: Qwen2Config(num_hidden_layers=num_blocks, **TINY_QWEN2),
    AutoModelForCausalLM,
    "model.layers",
)
MISTRAL = ModelKind(
    "mistral",
    TiedMistralForCausalLM,
    make_tiny_mistral_config,
    MistralForCausalLM,
    lambda num_blocks: MistralConfig(num_hidden_layers=num_blocks, **TINY_MISTRAL),
    AutoModelForCausalLM,
    "model.layers",
)
# Every tied model class the package ships; tests parametrised over it cover a new class by adding it here.
EVERY_KIND = (GPT2, BERT, LLAMA, QWEN2, MISTRAL)
every_kind = pytest.mark.parametrize("kind", EVERY_KIND, ids=lambda kind: kind.name)


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
