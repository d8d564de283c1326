"""PEFT (LoRA) on tied blocks: every position trains its own adapter on the shared weights, and merging is correct
once `untie_adapted_blocks()` has given the adapted blocks weights of their own.

PEFT merges each adapted layer's update into its base weight; on tied blocks that weight is shared, so PEFT's
merge on its own adds the update of every position into it (peft#1707). PEFT offers the base model no hook to
refuse a merge, so the model warns when adapters land on shared weights and `untie_adapted_blocks()` is the
documented way.
"""

import warnings

import pytest
import torch
from helpers.models import GPT2, TINY_GPT2, every_kind
from peft import LoraConfig, get_peft_model
from transformers import TrainerCallback

INPUT_IDS = torch.randint(1, TINY_GPT2["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))


def lora(**overrides) -> LoraConfig:
    # Random B (init_lora_weights=False): each position's update is non-zero and different from the others'.
    return LoraConfig(**{"r": 4, "target_modules": "all-linear", "init_lora_weights": False, **overrides})


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


def add_adapters(model, config: LoraConfig, warns: str | None):
    """`get_peft_model`, checking the tied model's warning: `warns` is part of it (None: no warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = get_peft_model(model, config)
    ours = [str(warning.message) for warning in caught if "PEFT adapters were added" in str(warning.message)]
    if warns is None:
        assert ours == []
    else:
        assert len(ours) == 1 and warns in ours[0]
    return peft_model


def lora_parameters(model) -> dict[str, torch.nn.Parameter]:
    return {name: parameter for name, parameter in model.named_parameters() if "lora_" in name}


@every_kind
def test_merge_after_untie_adapted_blocks_keeps_the_logits_of_the_adapter_model(kind):
    model = kind.tied_model([0, 0, 0, 3])
    peft_model = add_adapters(model, lora(), warns="blocks [0, 1, 2], which share their weights")
    expected = logits(peft_model)
    adapters = lora_parameters(peft_model)

    report = peft_model.untie_adapted_blocks()  # PEFT forwards the call to the tied model

    assert report.new_map.to_list() == [0, 1, 2, 3]
    assert lora_parameters(peft_model) == adapters  # each position keeps its own adapter objects
    merged = peft_model.merge_and_unload()
    assert merged is model and model.tying_map.to_list() == [0, 1, 2, 3]
    torch.testing.assert_close(logits(merged), expected)
    torch.testing.assert_close(logits(merged.to_untied()), expected)


def test_blocks_without_adapters_keep_sharing_and_blocks_apart_from_the_ties_do_not_warn():
    model = GPT2.tied_model([0, 0, 0, 0])
    config = lora(target_modules=["c_attn", "c_fc"], layers_to_transform=[2])
    peft_model = add_adapters(model, config, warns="blocks [2], which share")
    expected = logits(peft_model)

    peft_model.untie_adapted_blocks()
    merged = peft_model.merge_and_unload()

    assert merged.tying_map.to_list() == [0, 0, 2, 0]
    assert merged.transformer.h[3].mlp.c_fc.weight is merged.transformer.h[0].mlp.c_fc.weight
    torch.testing.assert_close(logits(merged), expected)
    add_adapters(GPT2.tied_model([0, 1, 1, 3]), lora(target_modules=["c_attn"], layers_to_transform=[0, 3]), warns=None)


def test_untying_adapters_that_are_merged_already_is_refused():
    peft_model = add_adapters(GPT2.tied_model([0, 0, 2, 2]), lora(), warns="blocks [0, 1, 2, 3]")
    peft_model.merge_adapter()
    with pytest.raises(ValueError, match=r"adapters of blocks \[0, 1, 2, 3\] are merged already: call unmerge_adapter"):
        peft_model.untie_adapted_blocks()


def test_to_untied_merges_each_positions_adapters_into_its_own_weights_and_leaves_the_model_alone():
    peft_model = add_adapters(GPT2.tied_model([0, 0, 2, 2]), lora(), warns="blocks [0, 1, 2, 3]")
    expected = logits(peft_model)
    plain = peft_model.get_base_model().to_untied()
    assert type(plain).__name__ == "GPT2LMHeadModel"
    torch.testing.assert_close(logits(plain.eval()), expected)
    assert torch.equal(logits(peft_model), expected) and peft_model.get_base_model().tying_map.to_list() == [0, 0, 2, 2]
    peft_model.merge_adapter()
    with pytest.raises(ValueError, match=r"adapters of 16 layers \(transformer.h.0.attn.c_attn, .*\) are merged already: call unmerge_adapter"):
        peft_model.get_base_model().to_untied()


def test_a_tying_strategy_on_a_peft_model_says_that_peft_models_are_not_supported(tmp_path):
    from hf_layertie import TyingTrainer, TyingTrainingArguments

    peft_model = add_adapters(GPT2.tied_model([0, 0, 2, 2]), lora(), warns="PEFT adapters were added")
    args = TyingTrainingArguments(output_dir=str(tmp_path), tying_strategy="dlt", use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match=r"tying_strategy='dlt' does not support PEFT-wrapped models \(PeftModel.* around a TiedGPT2LMHeadModel\).*with tying_strategy='none'"):
        TyingTrainer(model=peft_model, args=args)
    TyingTrainer(model=peft_model, args=args.without_tying())  # adapters on the fixed map train as usual


class StepsTrained(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_adapters_trained_on_a_fixed_map_resume_from_their_last_checkpoint(tmp_path):
    """A PEFT model's checkpoint holds its adapters (no config.json or model weights): it counts as complete, and
    training continues from it."""
    from datasets import Dataset

    from hf_layertie import TyingTrainer, TyingTrainingArguments
    from hf_layertie.trainer.checkpoint_format import missing_checkpoint_files

    rows = torch.randint(1, TINY_GPT2["vocab_size"], (32, 12), generator=torch.Generator().manual_seed(1))
    data = Dataset.from_dict({"input_ids": rows.tolist(), "labels": rows.tolist()})

    def trainer(max_steps: int) -> TyingTrainer:
        model = add_adapters(GPT2.tied_model([0, 0, 2, 2]), lora(), warns="PEFT adapters were added")
        args = TyingTrainingArguments(
            output_dir=str(tmp_path), tying_strategy="none", max_steps=max_steps, save_steps=2, per_device_train_batch_size=4,
            use_cpu=True, report_to=[], disable_tqdm=True,
        )  # fmt: skip
        return TyingTrainer(model=model, args=args, train_dataset=data)

    trainer(4).train()
    assert missing_checkpoint_files(tmp_path / "checkpoint-4") == []
    resumed, trained = trainer(6), StepsTrained()
    resumed.add_callback(trained)
    resumed.train(resume_from_checkpoint=True)
    assert trained.steps == [5, 6]  # continued from step 4, not restarted
