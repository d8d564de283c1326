"""Relaxed ties (README, "Compressing a trained model"): a LoRA per block position on the shared weights, started
from what the tie took from each position, trained with the shared weights, saved with the tied base, resumed, and
exported with each position's adapters merged into its own weights."""

import json
import sys

import pytest
import torch
from helpers.models import GPT2, every_kind, load_cleanly, logits, perturb_
from helpers.scripts import tiny_flags
from helpers.training import OptimizerMatchesModel, make_trainer, tiny_model, tying_args
from transformers import AutoModelForCausalLM, TrainerCallback

from hf_layertie.language_modeling import CAUSAL_LM, run
from hf_layertie.relaxed_ties import check_lora_rank, relax_ties

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "config.json", "model.safetensors")


def weights_of_blocks(model) -> dict[int, dict[str, torch.Tensor]]:
    return {
        block: {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
        for block, module in enumerate(model.tied_blocks)
    }


def perturb_matrices_(model, seed: int) -> None:
    """Make the blocks' weight matrices differ (LoRA corrects those; biases and norms stay equal across blocks)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.tied_blocks.parameters():
            if parameter.ndim == 2:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)


def converted(kind, lora_rank: int, tying_map=(0, 0, 2, 2)):
    """A tied model whose 4 blocks' weight matrices all differ, converted to `tying_map` with mean init and relaxed
    at `lora_rank`; returns it, its logits before the conversion and its blocks' weights then."""
    model = kind.tied_model([0, 1, 2, 3])
    perturb_matrices_(model, seed=5)
    before, expected = weights_of_blocks(model), logits(model)
    model.retie(list(tying_map), tie_init="mean")
    relax_ties(model, lora_rank, "svd", before)
    return model, expected, before


@every_kind
def test_full_rank_relaxation_restores_the_trained_model_and_the_folder_and_export_keep_its_logits(kind, tmp_path):
    model, expected, _ = converted(kind, lora_rank=16)  # 16 = the hidden size: every residual kept whole
    relaxed = logits(model)
    torch.testing.assert_close(relaxed, expected, rtol=1e-4, atol=1e-5)
    assert model.tying_map.to_list() == [0, 0, 2, 2]

    model.save_pretrained(tmp_path / "relaxed")
    assert all((tmp_path / "relaxed" / name).is_file() for name in ADAPTER_FILES)
    reloaded = load_cleanly(kind.auto_class, tmp_path / "relaxed")
    assert reloaded.tying_map.to_list() == [0, 0, 2, 2]
    assert torch.equal(logits(reloaded), relaxed)
    reloaded.save_pretrained(tmp_path / "saved again")  # a loaded one too: its base under the base's own names
    assert torch.equal(logits(load_cleanly(kind.auto_class, tmp_path / "saved again")), relaxed)

    model.to_untied().save_pretrained(tmp_path / "export")
    stock = load_cleanly(kind.plain_class, tmp_path / "export")
    torch.testing.assert_close(logits(stock), relaxed, rtol=1e-5, atol=1e-6)
    assert torch.equal(logits(model), relaxed)  # the export merged a copy; the model keeps its adapters


def test_the_rank_limits_are_the_same_for_a_model_that_carries_its_adapters_already():
    """A run resumed with adapters in place is checked as the model without them: the adapters' own layers are not
    adapted layers, nor are their parameters the blocks'."""
    model = GPT2.tied_model([0, 0, 2, 2], n_embd=32)

    def refusal(rank):
        with pytest.raises(ValueError) as error:
            check_lora_rank(model, rank, num_distinct=2)
        return str(error.value)

    refused = refusal(13)
    assert refused.endswith("pass lora_rank=12 or less")
    check_lora_rank(model, 12, num_distinct=2)
    relax_ties(model, 8, "zero")
    check_lora_rank(model, 12, num_distinct=2)
    assert refusal(13) == refused


def test_each_position_starts_from_the_best_rank_r_approximation_of_what_the_tie_took():
    model, _, before = converted(GPT2, lora_rank=2)
    for block in range(4):
        layer = model.tied_blocks[block].mlp.c_fc
        residual = before[block]["mlp.c_fc.weight"] - layer.base_layer.weight.detach()
        left, singular, right = torch.linalg.svd(residual, full_matrices=False)
        best = left[:, :2] @ torch.diag(singular[:2]) @ right[:2]
        torch.testing.assert_close(layer.get_delta_weight("default"), best, rtol=1e-4, atol=1e-6)
        assert layer.base_layer.weight is model.tied_blocks[block // 2 * 2].mlp.c_fc.base_layer.weight
    assert all(parameter.requires_grad for parameter in model.parameters())  # the shared weights train too


def test_a_loaded_relaxed_model_is_frozen_but_the_scripts_train_all_of_it(tmp_path):
    """docs/compressing.md: transformers loads adapters for inference, every weight frozen; relaxed ties train the
    adapters and the shared weights, as the scripts' loading (`load_model`) gives back."""
    from hf_layertie.toolkit import load_model, load_tokenizer

    model, _, _ = converted(GPT2, lora_rank=2)
    model.save_pretrained(tmp_path)
    assert not any(parameter.requires_grad for parameter in GPT2.tied_class.from_pretrained(tmp_path).parameters())
    loaded = load_model("tied_gpt2", load_tokenizer("shakespeare-bpe"), str(tmp_path))
    assert all(parameter.requires_grad for parameter in loaded.parameters())


def test_a_position_that_kept_its_weights_starts_with_a_zero_update_that_can_learn():
    model = GPT2.tied_model([0, 1, 2, 3])
    perturb_(model, seed=5)
    before = weights_of_blocks(model)
    model.retie([0, 1, 1, 3])  # root init: blocks 0, 1 and 3 compute with the weights they had
    relax_ties(model, 2, "svd", before)
    for block in (0, 1, 3):
        layer = model.tied_blocks[block].attn.c_attn
        assert not layer.get_delta_weight("default").any()
        assert layer.lora_A["default"].weight.any()  # PEFT's init: A random, B zero, so B gets gradients
    assert model.tied_blocks[2].attn.c_attn.get_delta_weight("default").any()


class RecordsStartingWeights(TrainerCallback):
    """The shared weight and one adapter at the first step (similarity adds the adapters inside that step)."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 1:
            layer = model.tied_blocks[1].mlp.c_fc
            self.weights = [layer.base_layer.weight.detach().clone(), layer.lora_B["default"].weight.detach().clone()]


@pytest.mark.parametrize("strategy", ["static:0,0,2,2", "similarity:2"])
def test_the_trainer_relaxes_the_converted_map_and_trains_adapters_and_shared_weights(tmp_path, strategy):
    model = tiny_model()
    perturb_(model, seed=3)
    trainable_before = model.parameter_counts().trainable
    block_size = sum(parameter.numel() for parameter in model.tied_blocks[0].parameters())
    trainer = make_trainer(tmp_path, model=model, tying_strategy=strategy, tie_init="mean", lora_rank=2, max_steps=3)
    check, start = OptimizerMatchesModel(), RecordsStartingWeights()
    check.trainer = trainer
    trainer.add_callback(check)
    trainer.add_callback(start)
    trainer.train()

    assert check.checked_steps == 3  # adapters and shared weights are the optimizer's, exactly, at every step
    layer = model.tied_blocks[1].mlp.c_fc
    assert not torch.equal(layer.base_layer.weight, start.weights[0])
    assert not torch.equal(layer.lora_B["default"].weight, start.weights[1])
    # 2 of the 4 blocks' weights left, plus a rank-2 LoRA per linear layer and position, each counted once.
    lora = sum(parameter.numel() for name, parameter in model.named_parameters() if "lora_" in name)
    assert lora == 4 * sum(2 * (layer.in_features + layer.out_features) for layer in _linear_layers(model.tied_blocks[0]))
    assert model.parameter_counts().trainable == trainable_before - 2 * block_size + lora


def _linear_layers(block):
    return [module for name, module in block.named_modules() if hasattr(module, "lora_A")]


def assert_resumed_from_step_3_equals_uninterrupted(trainer, tmp_path) -> None:
    """`trainer(folder)` trained to the end, and again resumed from the first run's checkpoint-3: the same weights,
    adapters among them."""
    uninterrupted = trainer("full")
    uninterrupted.train()
    resumed = trainer("resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    final, expected = resumed.model.state_dict(), uninterrupted.model.state_dict()
    assert final.keys() == expected.keys() and any("lora_" in name for name in final)
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "strategy, warmup",
    [("static:0,0,2,2", None), ("similarity:2", 0), ("similarity:2", 4)],  # warm-up 4: checkpoint-3 precedes the tie
)
def test_a_relaxed_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(tmp_path, strategy, warmup):
    overrides = dict(tying_strategy=strategy, tie_init="mean", lora_rank=2, max_steps=6, save_strategy="steps", save_steps=3)
    if warmup is not None:
        overrides["similarity_warmup_steps"] = warmup

    def trainer(folder):
        model = tiny_model()
        perturb_(model, seed=3)
        return make_trainer(tmp_path / folder, model=model, **overrides)

    assert_resumed_from_step_3_equals_uninterrupted(trainer, tmp_path)


@pytest.mark.parametrize("strategy", ["none", "static:0,0,2,2"])
def test_a_relaxed_folder_trained_on_as_it_is_resumes_and_ends_on_its_best_with_its_adapters(tmp_path, strategy):
    """docs/compressing.md: a relaxed folder trained on without lora_rank (as `run_clm.py --model_name_or_path` on it
    does) resumes from its checkpoint as the uninterrupted run goes on, and ends on its best checkpoint's base and
    adapters: both are loaded as relaxed ties, not as a plain model's weights."""
    from hf_layertie.toolkit import load_model, load_tokenizer

    model, _, _ = converted(GPT2, lora_rank=2)
    model.save_pretrained(tmp_path / "relaxed")

    def trainer(folder, **overrides):
        loaded = load_model("tied_gpt2", load_tokenizer("shakespeare-bpe"), str(tmp_path / "relaxed"))
        settings = dict(tying_strategy=strategy, max_steps=6, save_strategy="steps", save_steps=3)
        return make_trainer(tmp_path / folder, model=loaded, **{**settings, **overrides})

    assert_resumed_from_step_3_equals_uninterrupted(trainer, tmp_path)

    best = trainer("best", callbacks=[ChoosesBestCheckpoint(3)], eval_strategy="steps", eval_steps=3, load_best_model_at_end=True)
    best.train()
    best.model.eval()
    torch.testing.assert_close(logits(best.model), logits(load_cleanly(AutoModelForCausalLM, tmp_path / "best" / "checkpoint-3")), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["dlt", "random", "static:cycle:2", "similarity:2"])
def test_a_relaxed_folder_is_not_re_tied_by_a_strategy_that_changes_its_map(tmp_path, strategy):
    """Its adapters were fitted to the weights each position shares under its map (0 0 2 2): a strategy that moves
    the map would leave them on other weights. Refused when the trainer is built, before a step."""
    from hf_layertie.toolkit import load_model, load_tokenizer

    model, _, _ = converted(GPT2, lora_rank=2)
    model.save_pretrained(tmp_path / "relaxed")
    loaded = load_model("tied_gpt2", load_tokenizer("shakespeare-bpe"), str(tmp_path / "relaxed"))
    warmup = {"similarity_warmup_steps": 2} if strategy.startswith("similarity") else {}
    with pytest.raises(ValueError, match=rf"tying_strategy='{strategy}' would change the map of a model that carries relaxed ties' adapters \(a relaxed folder, map 0 0 2 2\)"):
        make_trainer(tmp_path / "run", model=loaded, tying_strategy=strategy, max_steps=4, **warmup)


class ChoosesBestCheckpoint(TrainerCallback):
    """Stands in for the validation metric: names checkpoint-`step` the best one, whatever the losses were."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        state.best_model_checkpoint = f"{args.output_dir}/checkpoint-{self.step}"


@pytest.mark.parametrize("best_step", [2, 6])  # the tie comes at step 3: before it, the checkpoint has no adapters
def test_a_relaxed_run_ends_with_its_best_checkpoint_saved_before_or_after_the_tie(tmp_path, best_step):
    model = tiny_model()
    perturb_(model, seed=3)
    trainer = make_trainer(
        tmp_path, model=model, callbacks=[ChoosesBestCheckpoint(best_step)], tying_strategy="similarity:2",
        similarity_warmup_steps=3, lora_rank=2, max_steps=6, save_strategy="steps", save_steps=2,
        eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
    )
    trainer.train()
    trainer.model.eval()

    best = load_cleanly(AutoModelForCausalLM, tmp_path / f"checkpoint-{best_step}")
    assert (tmp_path / f"checkpoint-{best_step}" / "adapter_config.json").is_file() == (best_step == 6)
    assert trainer.model.tying_map.to_list() == best.tying_map.to_list()
    torch.testing.assert_close(logits(trainer.model), logits(best), rtol=1e-5, atol=1e-6)


def test_a_relaxed_folder_names_no_other_base_and_a_plain_save_over_it_removes_its_adapters(tmp_path):
    model, _, _ = converted(GPT2, lora_rank=2)
    model.save_pretrained(tmp_path)
    # From a Hub repo id, transformers would load the model named here instead of the folder's own base.
    assert json.loads((tmp_path / "adapter_config.json").read_text())["base_model_name_or_path"] is None

    plain = GPT2.tied_model([0, 0, 2, 2])
    plain.save_pretrained(tmp_path)
    assert not any((tmp_path / name).exists() for name in ("adapter_config.json", "adapter_model.safetensors"))
    reloaded = load_cleanly(GPT2.auto_class, tmp_path)
    assert not any("lora_" in name for name, _ in reloaded.named_parameters())
    assert torch.equal(logits(reloaded), logits(plain))


def test_the_export_leaves_out_disabled_adapters_as_the_model_does():
    model, _, _ = converted(GPT2, lora_rank=2)
    model.disable_adapters()
    torch.testing.assert_close(logits(model.to_untied()), logits(model), rtol=1e-5, atol=1e-6)
    model.enable_adapters()
    torch.testing.assert_close(logits(model.to_untied()), logits(model), rtol=1e-5, atol=1e-6)


def test_the_export_of_a_reloaded_relaxed_model_is_trainable_throughout(tmp_path):
    """Loading adapters freezes every base weight; the export, a merged model, trains as any plain model."""
    model, _, _ = converted(GPT2, lora_rank=2)
    model.save_pretrained(tmp_path)
    reloaded = load_cleanly(GPT2.auto_class, tmp_path)
    assert not any(parameter.requires_grad for name, parameter in reloaded.named_parameters() if "lora_" not in name)
    assert all(parameter.requires_grad for parameter in reloaded.to_untied().parameters())


def test_a_peft_older_than_transformers_integrates_is_refused_naming_both(monkeypatch):
    from transformers.integrations import peft as peft_integration

    from hf_layertie.relaxed_ties import check_lora_settings

    monkeypatch.setattr(peft_integration, "MIN_PEFT_VERSION", "99.0")
    with pytest.raises(ImportError, match=r"lora_rank \(relaxed ties\) needs PEFT 99.0 or newer with transformers .*; PEFT .* is installed"):
        check_lora_settings(8, "svd")


def test_run_clm_relaxes_a_converted_checkpoint_and_exports_it_for_stock_transformers(tmp_path, text_files, trained_plain_checkpoint):
    extra = ("--tying_strategy", "static:sequence:2", "--tie_init", "mean", "--lora_rank", "2")
    flags = [flag for flag in tiny_flags(tmp_path / "run", text_files, "", *extra) if flag not in ("--config_overrides", "")]
    run(CAUSAL_LM, [*flags, "--model_name_or_path", str(trained_plain_checkpoint)])

    relaxed = AutoModelForCausalLM.from_pretrained(tmp_path / "run").eval()
    assert relaxed.tying_map.to_list() == [0, 0, 2]
    assert any("lora_" in name for name, _ in relaxed.named_parameters())
    relaxed.to_untied().save_pretrained(tmp_path / "export")
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert type(stock).__name__ == "GPT2LMHeadModel"
    ids = torch.randint(0, stock.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(stock(input_ids=ids).logits, relaxed(input_ids=ids).logits, rtol=1e-5, atol=1e-6)

    # Trained further from its folder (transformers loads adapters frozen, for inference): weights and adapters train.
    further = [flag for flag in tiny_flags(tmp_path / "further", text_files, "", "--tying_strategy", "none") if flag not in ("--config_overrides", "")]
    run(CAUSAL_LM, [*further, "--model_name_or_path", str(tmp_path / "run")])
    before = dict(relaxed.named_parameters())
    after = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "further").named_parameters())
    for name in ("transformer.h.0.mlp.c_fc.base_layer.weight", "transformer.h.0.mlp.c_fc.lora_B.default.weight"):
        assert not torch.equal(after[name], before[name]), name


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(tying_strategy="static:all", lora_rank=0), r"lora_rank must be an integer >= 1 \(and below 2\*\*63\), got 0"),
        (dict(tying_strategy="static:all", lora_rank=2, lora_init="pissa"), r"lora_init must be one of 'svd', 'zero', got 'pissa'"),
        (dict(tying_strategy="static:all", lora_init="zero"), r"lora_init='zero' needs lora_rank"),
        (dict(tying_strategy="dlt", lora_rank=2), r"tying_strategy='dlt' does not read lora_rank"),
    ],
)
def test_relaxed_tie_settings_are_checked_naming_the_setting(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tying_args(tmp_path, **overrides)


@pytest.mark.parametrize("strategy", ["static:0,0,2,2", "similarity:2"])
def test_a_rank_without_peft_is_refused_with_the_settings_before_any_step(tmp_path, monkeypatch, strategy):
    # similarity applies its map (and the adapters) after the warm-up: without this check it trained the warm-up first.
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"lora_rank \(relaxed ties\) needs PEFT: pip install 'hf-layertie\[peft\]'"):
        tying_args(tmp_path, tying_strategy=strategy, lora_rank=1, similarity_warmup_steps=2 if "similarity" in strategy else None)


def test_relaxing_a_model_that_carries_adapters_already_is_refused():
    model, _, before = converted(GPT2, lora_rank=2)
    with pytest.raises(ValueError, match="carries PEFT adapters already"):
        relax_ties(model, 2, "svd", before)


def test_per_position_adapters_train_from_scratch_with_a_zero_start(tmp_path):
    """The loop recipe's per-loop adapters: a looped map from scratch with `lora_rank 1`, `lora_init zero`; the
    model starts as the plain looped one (zero updates) and each position's adapter then learns on its own."""
    looped = tiny_model(seed=2)
    plain = tiny_model(seed=2)
    plain.retie([0, 1, 0, 1])
    trainer = make_trainer(tmp_path, model=looped, tying_strategy="static:cycle:2", lora_rank=1, lora_init="zero", max_steps=3)
    batch = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(trainer.model.eval()(input_ids=batch).logits, plain.eval()(input_ids=batch).logits, rtol=0, atol=0)
    trainer.train()
    adapters = [block.attn.c_attn.lora_B["default"].weight for block in trainer.model.transformer.h]
    assert all(adapter.abs().sum() > 0 for adapter in adapters)
    assert len({adapter.data_ptr() for adapter in adapters}) == 4 and not torch.equal(adapters[0], adapters[2])
