"""Tiny model configs and every tied model class the tests cover (`ModelKind`), and checks on tied models that
several test files use."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from hf_layertie import TIED_MODELS, TyingMap

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


@st.composite
def raw_tying_maps(draw, min_blocks: int = 3, max_blocks: int = 6) -> list[int]:
    """Valid maps as a user may write them: entry i is any block <= i, so chains (3 -> 2 -> 0) occur."""
    num_blocks = draw(st.integers(min_blocks, max_blocks))
    return [0] + [draw(st.integers(0, index)) for index in range(1, num_blocks)]


# --- checks on tied models ---------------------------------------------------------------------------

INPUT_IDS = torch.randint(1, TINY_GPT2["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))


def block_parameters(model: PreTrainedModel, block: int) -> dict[str, nn.Parameter]:
    return dict(model.tied_blocks[block].named_parameters(remove_duplicate=False))


def assert_blocks_share_as(model: PreTrainedModel, tying_map) -> None:
    """Tied blocks hold their root's very Parameter objects; independent blocks share no Parameter or storage."""
    tying_map = TyingMap(tying_map)
    assert model.tying_map == tying_map
    assert model.config.tying_map in (None, tying_map.to_list())
    for block, root in enumerate(tying_map):
        own, roots = block_parameters(model, block), block_parameters(model, root)
        assert own.keys() == roots.keys()
        assert all(own[name] is roots[name] for name in own), f"block {block} does not share block {root}'s Parameters"
    storages = [
        {parameter.data_ptr() for parameter in block_parameters(model, block).values()}
        for block in tying_map.independent_blocks
    ]
    assert sum(map(len, storages)) == len(set().union(*storages)), "independent blocks share storage"


def logits(model: PreTrainedModel) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


def load_cleanly(model_class: type[PreTrainedModel], directory: Path, **load_kwargs) -> PreTrainedModel:
    """Load and check that transformers found every weight it expected (nothing re-initialised or dropped)."""
    model, loading_info = model_class.from_pretrained(directory, output_loading_info=True, **load_kwargs)
    assert not any(loading_info.values()), loading_info
    return model.eval()


def perturb_(model: PreTrainedModel, seed: int) -> None:
    """Move every weight away from its initial value, so copies of stale weights would show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
