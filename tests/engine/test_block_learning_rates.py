"""A learning rate per block by how many positions use it (`loop_lr_exponent`): what one step computes, the groups
through re-ties and a resume, and the refusals."""

import pytest
import torch
from helpers.training import (
    assert_resuming_equals_the_uninterrupted_run,
    make_trainer,
    tiny_model,
    token_dataset,
    tying_args,
)
from transformers import TrainerCallback

from hf_layertie import TyingTrainer, TyingTrainingArguments
from hf_layertie.engine.block_learning_rates import BLOCK_USES, block_uses


def one_sgd_step(tmp_path, **settings) -> dict[str, torch.Tensor]:
    """The change of every weight in one plain SGD step (no momentum, constant rate, no clipping) under `0 1 1 1`."""
    model = tiny_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trainer = make_trainer(
        tmp_path, model=model, tying_strategy="static:0,1,1,1", max_steps=1, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=0.0, **settings,
    )  # fmt: skip
    trainer.train()
    return {name: tensor - before[name] for name, tensor in trainer.model.state_dict().items()}


def test_a_block_used_at_three_positions_steps_a_third_as_far(tmp_path):
    """SGD moves a weight by lr x gradient: with exponent 1, block 1 (positions 1, 2, 3) moves by a third of what it
    moves at one learning rate, block 0 and the embeddings as far; exponent 0.5 divides by sqrt(3)."""
    plain = one_sgd_step(tmp_path / "plain")
    for exponent, factor in ((1.0, 1 / 3), (0.5, 3**-0.5)):
        scaled = one_sgd_step(tmp_path / str(exponent), loop_lr_exponent=exponent)
        for name in ("transformer.h.1.mlp.c_fc.weight", "transformer.h.1.attn.c_attn.bias"):
            # Differences of float32 weights near 0.02 carry rounding of about 2e-9: far below the steps compared.
            assert plain[name].abs().max() > 1e-6
            torch.testing.assert_close(scaled[name], plain[name] * factor, rtol=1e-4, atol=1e-8)
        for name in ("transformer.h.0.mlp.c_fc.weight", "transformer.wte.weight", "transformer.ln_f.weight"):
            torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=0)


class GroupsFollowTheMap(TrainerCallback):
    """After every step: each block Parameter sits in the group of its use count, at the scheduler's rate over that
    count, and the number of groups never changes."""

    def __init__(self, trainer):
        self.trainer, self.maps, self.group_counts = trainer, set(), set()

    def on_step_end(self, args, state, control, **kwargs):
        optimizer = self.trainer.optimizer.optimizer if hasattr(self.trainer.optimizer, "optimizer") else self.trainer.optimizer
        uses = block_uses(self.trainer.model)
        base_rate = self.trainer.lr_scheduler.get_last_lr()[0]
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                assert uses.get(parameter, 1) == group[BLOCK_USES]
            assert group["lr"] == pytest.approx(base_rate / group[BLOCK_USES])
        held = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        assert len(held) == len(set(held)) == len([p for p in self.trainer.model.parameters() if p.requires_grad])
        self.maps.add(tuple(self.trainer.model.tying_map.to_list()))
        self.group_counts.add(len(optimizer.param_groups))


def test_the_groups_follow_every_retie_and_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    settings = dict(tying_strategy="random", max_steps=8, loop_lr_exponent=1.0, save_strategy="steps", save_steps=4)
    whole = make_trainer(tmp_path / "whole", **settings)
    watcher = GroupsFollowTheMap(whole)
    whole.add_callback(watcher)
    whole.train()
    assert len(watcher.maps) >= 3 and watcher.group_counts == {2 * 4}, watcher.maps  # decay / no decay x 4 counts
    assert_resuming_equals_the_uninterrupted_run(tmp_path, settings, resume_step=4, trained=True)


@pytest.mark.parametrize("value", [0, -1.0, True, float("inf")])
def test_the_exponent_must_be_a_positive_number(tmp_path, value):
    with pytest.raises(ValueError, match=rf"loop_lr_exponent must be a positive number .*got {value!r}"):
        TyingTrainingArguments(output_dir=str(tmp_path), loop_lr_exponent=value, report_to=[])


def test_an_optimizer_passed_in_is_refused_rather_than_left_with_one_rate(tmp_path):
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"loop_lr_exponent=1\.0 splits the param groups of the optimizer the Trainer builds"):
        TyingTrainer(
            model=model,
            args=tying_args(tmp_path, tying_strategy="static:0,1,1,1", loop_lr_exponent=1.0),
            train_dataset=token_dataset(),
            optimizers=(optimizer, None),
        )
