"""Test set-up for every test file: offline Hub, tiny model configs, every tied model class."""

import os

# Set before transformers / huggingface_hub are imported: without it a Hub-style load waits minutes for
# network time-outs on machines without internet.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import AutoModelForCausalLM, PreTrainedModel  # noqa: E402

from hf_layertie import TIED_MODELS  # noqa: E402

# The test models are tiny: one intra-op thread is several times faster than two on a shared 2-core
# machine, where spinning worker threads compete with the other processes.
torch.set_num_threads(1)


# Model sizes without the number of blocks.
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


@dataclass(frozen=True, eq=False)
class ModelKind:
    """One tied model class, named by the plain model type it ties ("gpt2", "llama", ...), and the sizes of its
    tiny test models (everything but the number of blocks); the classes come from `hf_layertie.TIED_MODELS`."""

    name: str
    sizes: dict

    @property
    def tied_class(self) -> type[PreTrainedModel]:
        return TIED_MODELS[f"tied_{self.name}"][0]

    @property
    def auto_class(self) -> type:
        return TIED_MODELS[f"tied_{self.name}"][1]

    @property
    def plain_class(self) -> type[PreTrainedModel]:
        return self.tied_class.untied_class()

    @property
    def blocks_path(self) -> str:
        return self.tied_class.tied_blocks_path

    @property
    def causal(self) -> bool:
        return self.auto_class is AutoModelForCausalLM

    def make_config(self, tying_map=None, num_blocks: int | None = None, **overrides):
        """A config small enough to build, save and load in milliseconds; `num_blocks` defaults to the map's length."""
        num_blocks = num_blocks or (len(tying_map) if tying_map is not None else 4)
        sizes = {**self.sizes, **overrides}
        return self.tied_class.config_class(num_hidden_layers=num_blocks, **sizes, tying_map=tying_map)

    def plain_config(self, num_blocks: int):
        return self.plain_class.config_class(num_hidden_layers=num_blocks, **self.sizes)

    def tied_model(self, tying_map, seed: int = 0, **overrides) -> PreTrainedModel:
        torch.manual_seed(seed)
        return self.tied_class(self.make_config(tying_map, **overrides)).eval()

    def plain_model(self, num_blocks: int, seed: int = 0) -> PreTrainedModel:
        torch.manual_seed(seed)
        return self.plain_class(self.plain_config(num_blocks)).eval()


GPT2 = ModelKind("gpt2", TINY_GPT2)
BERT = ModelKind("bert", TINY_BERT)
LLAMA = ModelKind("llama", TINY_LLAMA)
QWEN2 = ModelKind("qwen2", TINY_QWEN2)
MISTRAL = ModelKind("mistral", TINY_MISTRAL)
make_tiny_gpt2_config = GPT2.make_config
make_tiny_bert_config = BERT.make_config

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
