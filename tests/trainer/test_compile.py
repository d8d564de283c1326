"""`torch_compile` on a tied model: each block compiled on its own (accelerate's regional compilation), so that a
re-tie compiles nothing and the compiled model keeps computing what the eager one computes.

The backend is "aot_eager": dynamo traces and guards exactly as under the default "inductor" (the guards decide
whether a re-tie recompiles) and AOTAutograd builds the backward graphs, without inductor's C++ code generation,
which takes minutes on a loaded 2-core machine. One DLT run of a tiny TiedGPT2 (4 blocks of width 32, a vocabulary of
100, no dropout), deciding at every step, serves every test.
"""

import pytest
import torch
from helpers.models import make_tiny_gpt2_config
from helpers.training import token_dataset, tying_args
from torch._dynamo.eval_frame import OptimizedModule
from torch._dynamo.utils import counters
from transformers import TrainerCallback

from hf_layertie import TiedGPT2LMHeadModel, TyingTrainer

STEPS = 8


class CompileMeter(TrainerCallback):
    """After every optimizer step: the map the step trained under and the graphs dynamo had compiled so far."""

    def __init__(self, model: TiedGPT2LMHeadModel):
        self.model = model
        self.maps: list[tuple[int, ...]] = []
        self.graphs: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.maps.append(tuple(self.model.tying_map))
        self.graphs.append(counters["stats"]["unique_graphs"])


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """The trainer and its `CompileMeter` after a DLT run under torch_compile, from a fresh dynamo state."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    config = make_tiny_gpt2_config(num_blocks=4, n_embd=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = TiedGPT2LMHeadModel(config)
    meter = CompileMeter(model)
    with pytest.MonkeyPatch.context() as patch:
        # torch_compile exports accelerate's backend for the whole process: removed again after this run.
        patch.setenv("ACCELERATE_DYNAMO_BACKEND", "no")
        args = tying_args(
            tmp_path_factory.mktemp("compiled"), max_steps=STEPS, tying_interval=1, torch_compile_backend="aot_eager"
        )
        trainer = TyingTrainer(model=model, args=args, train_dataset=token_dataset(), callbacks=[meter])
        trainer.train()
    yield trainer, meter
    torch._dynamo.reset()


def test_torch_compile_compiles_each_block_of_a_tied_model_on_its_own(compiled_run):
    """The model trained is a copy whose blocks are compiled one by one, each computing with the very submodules and
    Parameters of its block, which `retie` re-points, and one graph serves all four blocks: the first step compiled
    one graph per region outside the blocks, plus one. (accelerate below 1.16 compiles the blocks themselves, 1.16
    shallow copies of them, which share their submodules.)"""
    trainer, meter = compiled_run
    blocks = list(trainer.model.tied_blocks)
    compiled = [module for module in trainer.model_wrapped.modules() if isinstance(module, OptimizedModule)]
    around_blocks = [module._orig_mod for module in compiled if isinstance(module._orig_mod, type(blocks[0]))]
    assert len(around_blocks) == len(blocks)
    for inner, block in zip(around_blocks, blocks):
        assert inner is block or inner._modules is block._modules
        assert all(ours is theirs for ours, theirs in zip(inner.parameters(), block.parameters(), strict=True))
    assert meter.graphs[0] == len(compiled) - len(blocks) + 1


def test_re_ties_under_torch_compile_compile_nothing_more(compiled_run):
    """DLT moved between several maps, and no step after the first compiled a graph."""
    _, meter = compiled_run
    assert len(set(meter.maps)) >= 3, meter.maps
    assert meter.graphs == [meter.graphs[0]] * STEPS, meter.graphs


def test_a_compiled_tied_model_computes_the_eager_logits_after_a_re_tie(compiled_run):
    """Re-tied to a map it never trained under, the compiled model's graphs (compiled under other maps) give the
    loss and logits the eager model gives with the same weights, and no graph is compiled for it. Both are called as
    a training step calls them (`compute_loss`, a batch of the training shape, the count of scored tokens)."""
    trainer, meter = compiled_run
    new_map = next(entries for entries in ((0, 1, 1, 3), (0, 0, 2, 2), (0, 1, 2, 0)) if entries not in meter.maps)
    trainer.model.retie(list(new_map))
    trainer.model.train()
    trainer.model_wrapped.train()  # the mode the graphs were compiled in (dropout is off)
    input_ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": input_ids, "labels": input_ids}
    scored = torch.tensor(input_ids.numel() - len(input_ids))
    compiled_loss, compiled = trainer.compute_loss(trainer.model_wrapped, batch, True, num_items_in_batch=scored)
    eager_loss, eager = trainer.compute_loss(trainer.model, batch, True, num_items_in_batch=scored)
    torch.testing.assert_close(compiled.logits, eager.logits)
    torch.testing.assert_close(compiled_loss, eager_loss)
    assert counters["stats"]["unique_graphs"] == meter.graphs[-1]
