"""Converting a trained model by tying (README, "Compressing a trained model"): `retie(..., tie_init="mean")` and
the trainer's `tie_init`, which start each group from its blocks' average, and `untie_init="own"`, which gives a
block untied by a decision its own weights from the start of training back."""

import pytest
import torch
from helpers.models import (
    GPT2,
    LLAMA,
    assert_blocks_share_as,
    block_parameters,
    every_kind,
    load_cleanly,
    logits,
    perturb_,
)
from helpers.scripts import tiny_flags
from helpers.training import OptimizerMatchesModel, make_trainer, tiny_model, tying_args
from transformers import AutoModelForCausalLM, AutoTokenizer, OPTConfig, OPTForCausalLM

from hf_layertie import TyingMap
from hf_layertie.language_modeling import CAUSAL_LM, run


@every_kind
def test_retie_with_mean_equals_loading_the_checkpoint_with_tie_init_mean(kind, tmp_path):
    entries = [0, 0, 2, 2, 2, 5]
    plain = kind.plain_model(len(entries), seed=5)
    perturb_(plain, seed=6)
    plain.save_pretrained(tmp_path)
    converted = load_cleanly(kind.tied_class, tmp_path, tying_map=entries, tie_init="mean")

    loaded = load_cleanly(kind.tied_class, tmp_path)
    report = loaded.retie(entries, tie_init="mean")

    assert_blocks_share_as(loaded, TyingMap(entries))
    assert torch.equal(logits(loaded), logits(converted))
    # Two groups are averages (new Parameters), block 5 keeps its own objects; blocks 1, 3, 4 and the sources vanish.
    assert len(report.averaged_from) == 2 * len(block_parameters(loaded, 0)) and not report.copied_from
    assert set(report.added) == set(report.averaged_from)


def test_retie_with_mean_weights_each_set_of_weights_by_the_blocks_that_used_it():
    model = GPT2.tied_model([0, 0, 0, 3], seed=1)  # blocks 0-2 compute with one set of weights, block 3 with another
    before = {root: block_parameters(model, root) for root in (0, 3)}
    model.retie([0, 0, 0, 0], tie_init="mean")
    for name, parameter in block_parameters(model, 0).items():
        assert torch.allclose(parameter, (3 * before[0][name] + before[3][name]) / 4)


@pytest.mark.parametrize("old, new", [([0, 0, 2, 3], [0, 0, 2, 2]), ([0, 0, 2, 2], [0, 0, 2, 2]), ([0, 0, 0, 0], [0, 0, 2, 2])])
def test_retie_with_mean_reports_as_added_only_the_parameters_it_made(old, new):
    model = GPT2.tied_model(old, seed=1)
    existing = set(model.parameters())
    report = model.retie(new, tie_init="mean")
    assert not set(report.added) & existing and len(set(report.added)) == len(report.added)
    assert set(report.added) == set(model.parameters()) - existing


def test_loading_a_tied_checkpoint_with_mean_averages_as_retie_does(tmp_path):
    GPT2.tied_model([0, 0, 0, 3], seed=1).save_pretrained(tmp_path)
    loaded = load_cleanly(GPT2.tied_class, tmp_path, tying_map=[0, 0, 0, 0], tie_init="mean")
    retied = load_cleanly(GPT2.tied_class, tmp_path)
    retied.retie([0, 0, 0, 0], tie_init="mean")
    assert torch.equal(logits(loaded), logits(retied))


def test_a_checkpoint_converted_with_mean_is_regrouped_from_its_roots_unless_told(tmp_path):
    plain = GPT2.plain_model(4, seed=5)
    perturb_(plain, seed=6)
    plain.save_pretrained(tmp_path / "plain")
    load_cleanly(GPT2.tied_class, tmp_path / "plain", tying_map=[0, 1, 1, 3], tie_init="mean").save_pretrained(tmp_path / "converted")

    regrouped = load_cleanly(GPT2.tied_class, tmp_path / "converted", tying_map=[0, 0, 0, 3])
    by_root = load_cleanly(GPT2.tied_class, tmp_path / "converted", tying_map=[0, 0, 0, 3], tie_init="root")
    by_mean = load_cleanly(GPT2.tied_class, tmp_path / "converted", tying_map=[0, 0, 0, 3], tie_init="mean")
    assert torch.equal(logits(regrouped), logits(by_root)) and not torch.equal(logits(regrouped), logits(by_mean))
    # The same through a config loaded from the checkpoint (its tie_init "mean") with the map changed.
    config = GPT2.tied_class.config_class.from_pretrained(tmp_path / "converted")
    config.tying_map = [0, 0, 0, 3]
    assert torch.equal(logits(load_cleanly(GPT2.tied_class, tmp_path / "converted", config=config)), logits(regrouped))
    # And through a config loaded with the map and the tie_init asked for (equal to the checkpoint's "mean"): `config=`
    # loads as the same arguments to the model's `from_pretrained` do.
    for tie_init, expected in (("mean", by_mean), ("root", by_root)):
        asked = GPT2.tied_class.config_class.from_pretrained(tmp_path / "converted", tying_map=[0, 0, 0, 3], tie_init=tie_init)
        assert torch.equal(logits(load_cleanly(GPT2.tied_class, tmp_path / "converted", config=asked)), logits(expected))


def test_retie_refuses_an_unknown_tie_init():
    with pytest.raises(ValueError, match=r"tie_init must be one of \('root', 'mean'\), got 'median'"):
        GPT2.tied_model([0, 1]).retie([0, 0], tie_init="median")


@pytest.mark.parametrize("strategy", ["static:0,0,2,2", "similarity:2"])
def test_the_trainer_converts_with_tie_init_mean_and_trains_the_averages(tmp_path, strategy):
    model = tiny_model()
    perturb_(model, seed=3)
    blocks = [{name: parameter.detach().clone() for name, parameter in block_parameters(model, block).items()} for block in range(4)]
    trainer = make_trainer(tmp_path, model=model, tying_strategy=strategy, tie_init="mean", learning_rate=0.0, max_steps=2)
    check = OptimizerMatchesModel()
    check.trainer = trainer
    trainer.add_callback(check)
    trainer.train()

    assert check.checked_steps == 2  # the averages are in the optimizer at every step
    for root, members in model.tying_map.groups().items():
        for name, parameter in block_parameters(model, root).items():
            assert torch.allclose(parameter, torch.stack([blocks[member][name] for member in members]).mean(dim=0))


@pytest.mark.parametrize("untie_init, restored", [("own", True), ("source", False)])
def test_untie_init_own_gives_an_untied_block_its_own_weights_back(tmp_path, untie_init, restored):
    # A learning rate of 0 keeps every weight where the decisions put it: an untied block's weights are its own
    # from the start (untie_init="own") or block 0's, which every block shared at first ("source").
    model = tiny_model(num_blocks=6)
    perturb_(model, seed=3)  # no two blocks alike, layer norms included
    start = [{name: parameter.detach().clone() for name, parameter in block_parameters(model, block).items()} for block in range(6)]
    trainer = make_trainer(tmp_path, model=model, tying_strategy="random", untie_init=untie_init, learning_rate=0.0, tying_interval=1)
    trainer.train()

    untied = [block for block in model.tying_map.independent_blocks if block > 0]
    assert untied, "no block was untied; pick another agent seed"
    for block in untied:
        for name, parameter in block_parameters(model, block).items():
            own = start[block][name]
            assert torch.equal(parameter, own) is restored
            assert torch.equal(parameter, start[0][name]) is not restored


def test_untie_init_own_restores_only_the_block_a_decision_unties(tmp_path):
    # From 0 1 1 1, tying block 1 to block 0 leaves blocks 2 and 3 independent of it under a new owner (block 2), with
    # the group's trained weights and optimizer state; untying block 3 then gives block 3 alone its starting weights.
    from hf_layertie.decisions import Decision

    model = tiny_model()
    perturb_(model, seed=3)
    start = [{name: parameter.detach().clone() for name, parameter in block_parameters(model, block).items()} for block in range(4)]
    trainer = make_trainer(tmp_path, model=model, tying_strategy="dlt", untie_init="own", tying_initial_map="0 1 1 1")
    trainer.create_optimizer()
    batch = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=batch, labels=batch).loss.backward()
    trainer.optimizer.step()  # every weight moves from its start and has AdamW state
    trained = {name: parameter.detach().clone() for name, parameter in block_parameters(model, 1).items()}

    trainer.engine.apply(Decision(index=0, step=1, map_after=TyingMap([0, 0, 2, 2]), block=1, source=0, untie_to_start=True))
    for name, parameter in block_parameters(model, 2).items():
        assert torch.equal(parameter, trained[name]) and "exp_avg" in trainer.optimizer.state[parameter]

    trainer.engine.apply(Decision(index=1, step=2, map_after=TyingMap([0, 0, 2, 3]), block=3, source=3, untie_to_start=True))
    for name, parameter in block_parameters(model, 3).items():
        assert torch.equal(parameter, start[3][name]) and parameter not in trainer.optimizer.state
    for name, parameter in block_parameters(model, 2).items():
        assert torch.equal(parameter, trained[name])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(tying_strategy="static:all", tie_init="median"), r"tie_init must be one of 'root', 'mean', got 'median'"),
        (dict(tying_strategy="dlt", untie_init="trained"), r"untie_init must be one of 'source', 'own', got 'trained'"),
        (dict(tying_strategy="static:all", untie_init="own"), "'static:all' does not read untie_init"),
        (dict(tying_strategy="none", tie_init="mean"), "'none' does not read tie_init"),
    ],
)
def test_conversion_settings_are_checked_naming_the_setting(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tying_args(tmp_path, **overrides)


# ----- the workflow from run_clm.py -----


@pytest.fixture(scope="module")
def plain_llama_checkpoint(tmp_path_factory, trained_plain_checkpoint):
    """A plain LlamaForCausalLM of 3 layers with the same tokenizer (the path users take with real checkpoints)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(trained_plain_checkpoint)
    sizes = {key: value for key, value in LLAMA.sizes.items() if key != "vocab_size"}
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, vocab_size=len(tokenizer), **sizes)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "checkpoint, strategy, expected_map",
    [
        ("trained_plain_checkpoint", "static:sequence:2", [0, 0, 2]),
        ("trained_plain_checkpoint", "similarity:2", None),
        ("plain_llama_checkpoint", "static:cycle:2", [0, 1, 0]),
    ],
)
def test_run_clm_converts_a_trained_checkpoint_and_exports_it_for_stock_transformers(
    tmp_path, text_files, request, checkpoint, strategy, expected_map
):
    flags = tiny_flags(tmp_path / "run", text_files, "", "--tying_strategy", strategy, "--tie_init", "mean")
    flags = [flag for flag in flags if flag not in ("--config_overrides", "")]
    run(CAUSAL_LM, [*flags, "--model_name_or_path", str(request.getfixturevalue(checkpoint))])

    tied = AutoModelForCausalLM.from_pretrained(tmp_path / "run").eval()
    assert tied.tying_map.num_distinct == 2
    if expected_map is not None:
        assert tied.tying_map.to_list() == expected_map
    tied.to_untied().save_pretrained(tmp_path / "export")
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    ids = torch.randint(0, stock.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(stock(input_ids=ids).logits, tied(input_ids=ids).logits)


@pytest.mark.parametrize(
    "strategy, message",
    [
        ("static:0,0,1,1", r"tying_strategy='static:0,0,1,1' does not fit the model: .*4 entries"),
        ("similarity:5", r"'similarity:5' asks for more distinct blocks than the model's 3"),
    ],
)
def test_a_map_that_does_not_fit_the_checkpoint_is_named(tmp_path, text_files, trained_plain_checkpoint, strategy, message):

    flags = [flag for flag in tiny_flags(tmp_path, text_files, "", "--tying_strategy", strategy) if flag not in ("--config_overrides", "")]
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, [*flags, "--model_name_or_path", str(trained_plain_checkpoint)])


def test_a_checkpoint_of_an_architecture_without_a_tied_class_is_named(tmp_path, text_files, trained_plain_checkpoint):
    OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2, vocab_size=100, word_embed_proj_dim=16)).save_pretrained(tmp_path / "opt")
    flags = [flag for flag in tiny_flags(tmp_path / "o", text_files, "", "--tying_strategy", "static:all") if flag not in ("--config_overrides", "")]
    with pytest.raises(ValueError, match=r"is a 'opt' checkpoint, which hf-layertie has no tied class for"):
        run(CAUSAL_LM, [*flags, "--model_name_or_path", str(tmp_path / "opt"), "--tokenizer_name", str(trained_plain_checkpoint)])


def test_similarity_ties_the_blocks_that_leave_their_input_unchanged_to_the_block_before():
    # Blocks 2, 3 and 5 write nothing into the residual stream (output projections zeroed): their angular distance
    # is 0, so similarity:3 keeps blocks 0, 1 and 4 and ties each of the others to the nearest one before it.
    from hf_layertie.block_similarity import block_angular_distances, similarity_tying_map

    model = tiny_model(num_blocks=6)
    perturb_(model, seed=2)
    with torch.no_grad():
        for block in (2, 3, 5):
            for projection in (model.tied_blocks[block].attn.c_proj, model.tied_blocks[block].mlp.c_proj):
                projection.weight.zero_()
                projection.bias.zero_()
    ids = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    distances = block_angular_distances(model, {"input_ids": ids})

    assert [distances[block] for block in (2, 3, 5)] == pytest.approx([0.0] * 3, abs=1e-3)
    assert min(distances[block] for block in (1, 4)) > 0.01
    assert similarity_tying_map(distances, 3).to_list() == [0, 1, 1, 1, 4, 4]


def test_block_distances_are_means_per_token_whatever_the_inputs_and_padding_is_left_out():
    from hf_layertie.block_similarity import block_angular_distances

    model = tiny_model(num_blocks=3)
    perturb_(model, seed=2)
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    by_ids = block_angular_distances(model, {"input_ids": ids})
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
    assert block_angular_distances(model, {"inputs_embeds": embeds}) == pytest.approx(by_ids)  # tokens, not numbers
    first_row = block_angular_distances(model, {"input_ids": ids[:1]})
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1] * 8, [0] * 8])}
    assert block_angular_distances(model, padded) == pytest.approx(first_row, rel=1e-5)
    with pytest.raises(ValueError, match=r"no token to measure \(attention_mask is all 0\)"):
        block_angular_distances(model, {"input_ids": ids, "attention_mask": torch.zeros_like(ids)})
