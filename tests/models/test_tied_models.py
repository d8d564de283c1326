"""Every tied model class (GPT-2, BERT, Llama, Qwen2, Mistral): sharing, checkpoints, retie, accounting,
conversion of plain checkpoints, export to plain models, loading, generation, training.

The properties run on random valid maps for every model class; models are tiny (3-6 blocks, width 16).
"""

import copy
import importlib.util
import json
import pickle
import re
from functools import cache
from pathlib import Path

import datasets
import pytest
import torch
from helpers.models import (
    EVERY_KIND,
    GPT2,
    INPUT_IDS,
    LLAMA,
    TINY_GPT2,
    ModelKind,
    assert_blocks_share_as,
    block_parameters,
    every_kind,
    load_cleanly,
    logits,
    make_tiny_gpt2_config,
    perturb_,
    raw_tying_maps,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, GPT2Config, PreTrainedModel, Trainer, TrainingArguments

from hf_layertie import TIED_MODELS, TiedGPT2LMHeadModel, TyingMap, parse_strategy

# Each example builds (and often saves and reloads) a model: about 0.1-0.4 s on one core.
FEW = settings(max_examples=10, deadline=None)
SOME = settings(max_examples=15, deadline=None)
causal_kinds = pytest.mark.parametrize("kind", [kind for kind in EVERY_KIND if kind.causal], ids=lambda kind: kind.name)


@st.composite
def map_pairs(draw, different_num_distinct: bool = False) -> tuple[TyingMap, TyingMap]:
    """Two canonical maps over the same number of blocks."""
    first = TyingMap(draw(raw_tying_maps()))
    other = raw_tying_maps(min_blocks=len(first), max_blocks=len(first)).map(TyingMap)
    if different_num_distinct:
        other = other.filter(lambda second: second.num_distinct != first.num_distinct)
    return first, draw(other)


# --- helpers -------------------------------------------------------------------------------------


def assert_round_trips(model: PreTrainedModel, directory: Path) -> PreTrainedModel:
    model.save_pretrained(directory)
    reloaded = load_cleanly(type(model), directory)
    assert torch.equal(logits(reloaded), logits(model))
    assert_blocks_share_as(reloaded, model.tying_map)
    return reloaded


def block_numel(model: PreTrainedModel, blocks_path: str) -> int:
    return sum(parameter.numel() for parameter in model.get_submodule(blocks_path)[0].parameters())


def block_index(key: str, blocks_path: str) -> int | None:
    """The block a checkpoint key belongs to (`transformer.h.10.ln_1.weight` -> 10), None outside the blocks."""
    prefix = f"{blocks_path}."
    return int(key[len(prefix) :].split(".")[0]) if key.startswith(prefix) else None


@cache
def plain_checkpoint(kind: ModelKind, num_blocks: int, directory: Path) -> dict[str, torch.Tensor]:
    """The tensors transformers' own (untied) class writes for the same architecture."""
    kind.plain_model(num_blocks).save_pretrained(directory / f"plain-{kind.name}-{num_blocks}")
    return load_file(directory / f"plain-{kind.name}-{num_blocks}" / "model.safetensors")


# --- sharing and checkpoints ---------------------------------------------------------------------


@every_kind
@SOME
@given(entries=raw_tying_maps())
def test_tied_blocks_hold_their_roots_parameter_objects(kind, entries):
    model = kind.tied_model(entries)

    assert_blocks_share_as(model, entries)
    assert model.config.tying_map == TyingMap(entries).to_list()
    blocks = model.get_submodule(kind.blocks_path)
    assert len({id(block) for block in blocks}) == len(entries), "every position keeps its own module"


@every_kind
def test_a_model_built_on_the_meta_device_and_given_its_weights_shares_as_its_map_says(kind):
    """The ways of materialising a model built without memory (`torch.device("meta")`): `to_empty` and
    `load_state_dict(..., assign=True)` each give every Parameter entry an object of its own, which would leave tied
    blocks with Parameters aliasing their root's storage (stepped once per alias). (Buffers outside the state dict,
    such as rotary frequencies, are the user's to initialise after either, as for any model.)"""
    source = kind.tied_model([0, 0, 2, 2])
    perturb_(source, seed=1)
    for materialise in ("to_empty", "assign"):
        with torch.device("meta"):
            model = kind.tied_class(kind.make_config([0, 0, 2, 2])).eval()
        if materialise == "to_empty":
            model.to_empty(device="cpu")
            model.load_state_dict(source.state_dict())
        else:
            model.load_state_dict(source.state_dict(), assign=True)
        assert_blocks_share_as(model, [0, 0, 2, 2])
        assert model.parameter_counts() == source.parameter_counts(), materialise
        loaded, expected = model.state_dict(), source.state_dict()
        assert all(torch.equal(loaded[name], expected[name]) for name in expected), materialise


def test_a_relaxed_model_built_on_the_meta_device_shares_its_base_weights_once_materialised():
    """Blocks with adapters (relaxed ties) keep their shared weights under PEFT's `base_layer`, which transformers'
    `tie_weights` leaves alone: `to_empty` ties them again all the same."""
    from hf_layertie.relaxed_ties import relax_ties

    with torch.device("meta"):
        model = GPT2.tied_class(GPT2.make_config([0, 0, 2, 2]))
    relax_ties(model, 2, "zero")
    model.to_empty(device="cpu")
    blocks = model.get_submodule(GPT2.blocks_path)
    assert blocks[1].attn.c_attn.base_layer.weight is blocks[0].attn.c_attn.base_layer.weight
    assert blocks[3].mlp.c_fc.base_layer.weight is blocks[2].mlp.c_fc.base_layer.weight


@every_kind
@FEW
@given(entries=raw_tying_maps())
def test_save_and_load_gives_identical_logits_and_the_same_sharing(kind, entries, tmp_path_factory):
    model = kind.tied_model(entries)
    perturb_(model, seed=len(entries))

    assert_round_trips(model, tmp_path_factory.mktemp("checkpoint"))


@every_kind
@FEW
@given(maps=map_pairs(different_num_distinct=True))
def test_checkpoint_stores_each_distinct_block_once(kind, maps, tmp_path_factory):
    directory = tmp_path_factory.mktemp("checkpoints")
    plain = plain_checkpoint(kind, len(maps[0]), tmp_path_factory.getbasetemp())
    sizes = {}
    for index, tying_map in enumerate(maps):
        kind.tied_model(tying_map).save_pretrained(directory / str(index))
        path = directory / str(index) / "model.safetensors"
        saved = load_file(path)
        blocks = {key: block_index(key, kind.blocks_path) for key in plain}
        expected_keys = {key for key, block in blocks.items() if block is None or tying_map.is_independent(block)}
        assert saved.keys() == expected_keys
        per_block = sum(1 for block in blocks.values() if block == 0)
        non_block = sum(1 for block in blocks.values() if block is None)
        assert len(saved) == non_block + tying_map.num_distinct * per_block
        sizes[tying_map.num_distinct] = (len(saved), path.stat().st_size)

    fewer, more = sorted(sizes)
    assert sizes[fewer][0] < sizes[more][0]
    assert sizes[fewer][1] < sizes[more][1]


@every_kind
@pytest.mark.parametrize(
    "entries",
    [
        [0, 0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],  # block 1 tied, blocks 10 and 11 independent
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 1],  # block 1 independent, blocks 10 and 11 tied to it
    ],
)
def test_block_1_ties_do_not_leak_into_blocks_10_and_11(kind, entries, tmp_path):
    # Unescaped patterns such as "transformer.h.1" also match "transformer.h.10..." (platform facts).
    model = kind.tied_model(entries)
    perturb_(model, seed=2)

    assert_round_trips(model, tmp_path)
    saved_blocks = {block_index(key, kind.blocks_path) for key in load_file(tmp_path / "model.safetensors")}
    assert saved_blocks - {None} == set(TyingMap(entries).independent_blocks)


@every_kind
def test_untied_word_embeddings_still_restore_block_ties(kind, tmp_path):
    # transformers returns no tied keys at all when tie_word_embeddings=False (platform facts).
    model = kind.tied_model([0, 0, 1, 3, 3], tie_word_embeddings=False)
    perturb_(model, seed=1)

    reloaded = assert_round_trips(model, tmp_path)

    assert reloaded.get_output_embeddings().weight is not reloaded.get_input_embeddings().weight
    assert torch.equal(reloaded.get_output_embeddings().weight, model.get_output_embeddings().weight)


# --- building from a config: only the distinct blocks are materialised ----------------------------

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.e2e  # a fresh process per build, measured
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak from /proc (Linux)")
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_building_a_tied_model_materialises_only_its_distinct_blocks(kind, tmp_path):
    """48 blocks of width 512 tied to 8 raise a fresh process's peak (VmHWM above the post-import baseline) as much as
    8 untied blocks do, within 25%, and loading the saved tied model stays as lean. Building every block before
    tying them raised it about 5.5 times as much (592 against 108 MiB for Llama)."""
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / "construction_memory_run.py"), kind, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rises = json.loads(completed.stdout.strip().splitlines()[-1])

    assert rises["untied"] > 40, rises  # 8 blocks of width 512 and the embeddings: about 85 MiB
    assert rises["tied"] <= 1.25 * rises["untied"], rises
    assert rises["loaded"] <= 1.25 * rises["untied"], rises


# A map whose owners (0, 2, 4, 6) are built after tied positions, so that a build drawing no random numbers for
# the tied positions would give them other weights.
INTERLEAVED = [0, 0, 2, 1, 4, 2, 6, 0]


@every_kind
def test_owners_get_the_weights_a_build_of_every_block_gives_them(kind):
    """The guarantee: for a seed, each owner's weights, and every weight outside the blocks, are bit-identical to
    those of transformers' plain (untied) class with the same blocks built with the same seed, which is what
    building every block and then tying them gave; so is the random generator's state after the build."""
    block_class = type(kind.plain_model(1).get_submodule(kind.blocks_path)[0])
    block_init = block_class.__init__

    tied = kind.tied_model(INTERLEAVED, seed=5)
    after_tied = torch.randn(4)
    plain = kind.plain_model(len(INTERLEAVED), seed=5)
    after_plain = torch.randn(4)

    assert block_class.__init__ is block_init  # the construction leaves the block class as it found it
    assert not any(parameter.is_meta for parameter in tied.parameters())
    assert_blocks_share_as(tied, INTERLEAVED)
    expected = plain.state_dict()
    for key, tensor in tied.state_dict().items():
        block = block_index(key, kind.blocks_path)
        if block is None or INTERLEAVED[block] == block:
            assert torch.equal(tensor, expected[key]), key
    assert torch.equal(after_tied, after_plain)


@every_kind
def test_a_lean_build_equals_one_that_materialises_every_block(kind, monkeypatch):
    tied = kind.tied_model(INTERLEAVED, seed=2)
    monkeypatch.setattr(kind.tied_class, "lean_construction", False)
    eager = kind.tied_model(INTERLEAVED, seed=2)

    expected = eager.state_dict()
    assert tied.state_dict().keys() == expected.keys()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in tied.state_dict().items())
    assert torch.equal(logits(tied), logits(eager))


@every_kind
def test_a_lean_build_saves_reloads_reties_and_unties(kind, tmp_path):
    model = kind.tied_model(parse_strategy("cycle:2", 6).to_list())
    reloaded = assert_round_trips(model, tmp_path)
    assert torch.equal(logits(reloaded), logits(model))

    before = logits(model)
    report = model.retie(list(range(6)))  # every position gets a copy of the weights it used
    assert_blocks_share_as(model, list(range(6)))
    assert len(report.added) == 4 * len(block_parameters(model, 0)) and report.removed == []
    assert torch.equal(logits(model), before)
    model.retie([0, 1, 0, 1, 0, 1])
    assert torch.equal(logits(model), before)


# --- retie ---------------------------------------------------------------------------------------


@every_kind
@SOME
@given(maps=map_pairs())
def test_retie_moves_parameters_where_it_can_and_each_group_starts_from_what_its_root_used(
    kind, maps, tmp_path_factory
):
    old_map, new_map = maps
    model = kind.tied_model(old_map)
    perturb_(model, seed=3)
    before = {id(parameter): parameter for parameter in model.parameters()}
    parameters_before = [block_parameters(model, block) for block in range(len(old_map))]
    weights_before = [
        {name: parameter.detach().clone() for name, parameter in parameters.items()} for parameters in parameters_before
    ]

    report = model.retie(new_map.to_list())

    after = {id(parameter): parameter for parameter in model.parameters()}
    assert (report.old_map, report.new_map, report.changed) == (old_map, new_map, old_map != new_map)
    assert {id(parameter) for parameter in report.added} == after.keys() - before.keys()
    assert {id(parameter) for parameter in report.removed} == before.keys() - after.keys()
    assert len(report.added) == len({id(parameter) for parameter in report.added})
    assert {id(parameter) for parameter in report.copied_from} == {id(parameter) for parameter in report.added}
    assert_blocks_share_as(model, new_map)
    # Old root s's objects go to the smallest new root r with old_map[r] == s; other such groups get copies.
    keeper = {}
    for root in new_map.independent_blocks:
        keeper.setdefault(old_map[root], root)
    for block, root in enumerate(new_map):
        source = old_map[root]
        for name, parameter in block_parameters(model, block).items():
            assert torch.equal(parameter, weights_before[root][name]), f"block {block} {name}"
            if keeper[source] == root:
                assert parameter is parameters_before[source][name], f"block {block} {name} was copied, not moved"
            else:
                assert id(parameter) not in before
                assert report.copied_from[parameter] is parameters_before[source][name]
                assert parameter.requires_grad
    gone = set(old_map.independent_blocks) - keeper.keys()
    assert len(report.removed) == len(gone) * len(parameters_before[0])

    assert_round_trips(model, tmp_path_factory.mktemp("retied"))


def test_tying_a_root_elsewhere_moves_its_weights_to_the_rest_of_its_group():
    # The agent's decision "tie block 1 to block 0": blocks 2 and 3 stay together and keep computing as before.
    model = GPT2.tied_model([0, 1, 1, 1])
    perturb_(model, seed=5)
    weights_of_block_1 = block_parameters(model, 1)

    report = model.retie([0, 0, 2, 2])

    assert report.added == [] and report.removed == [] and report.copied_from == {}
    for block in (2, 3):
        assert block_parameters(model, block) == weights_of_block_1
    assert block_parameters(model, 1) == block_parameters(model, 0)


def test_untie_copies_the_current_weights_into_fresh_storage():
    model = GPT2.tied_model([0, 0, 0, 0])
    perturb_(model, seed=4)
    source = block_parameters(model, 0)

    report = model.retie([0, 1, 1, 3])

    for block in (1, 3):
        for name, parameter in block_parameters(model, block).items():
            assert torch.equal(parameter, source[name])
            others = [block_parameters(model, other)[name] for other in range(4) if model.tying_map[other] != block]
            assert all(parameter.data_ptr() != other.data_ptr() for other in others)
    assert len(report.added) == 2 * len(source)
    assert report.removed == []
    # Training a block after the untie leaves its former root alone.
    with torch.no_grad():
        block_parameters(model, 1)["mlp.c_fc.weight"].add_(1.0)
    assert not torch.equal(block_parameters(model, 1)["mlp.c_fc.weight"], source["mlp.c_fc.weight"])
    assert torch.equal(block_parameters(model, 2)["mlp.c_fc.weight"], block_parameters(model, 1)["mlp.c_fc.weight"])


def test_retie_rejects_an_invalid_map_and_changes_nothing():
    model = GPT2.tied_model([0, 0, 2, 2])
    parameters = [id(parameter) for parameter in model.parameters()]

    with pytest.raises(ValueError, match=r"tying_map\[3\] = 4 is a forward reference"):
        model.retie([0, 1, 2, 4])
    with pytest.raises(ValueError, match="tying_map has 3 entries but the model has 4 blocks"):
        model.retie([0, 1, 2])

    assert [id(parameter) for parameter in model.parameters()] == parameters
    assert_blocks_share_as(model, [0, 0, 2, 2])


# --- invalid maps in configs and checkpoints -----------------------------------------------------

INVALID_MAPS = [
    ([0, 0, 3, 0], "tying_map[2] = 3 is a forward reference"),
    ([0, 0, 1], "tying_map has 3 entries but the model has 4 blocks"),
    ([0, 0, "1", 0], "tying_map[2] = '1' is not an integer block index"),
    ([0, 0.5, 1, 0], "tying_map[1] = 0.5 is not an integer block index"),
    ([0, -2, 1, 0], "tying_map[1] = -2 is negative"),
    ([2, 0, 1, 0], "tying_map[0] = 2: block 0 is always independent"),
]


@every_kind
@pytest.mark.parametrize(("entries", "message"), INVALID_MAPS)
def test_config_rejects_an_invalid_map(kind, entries, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        kind.make_config(entries, num_blocks=4)


@every_kind
@pytest.mark.parametrize(("entries", "message"), INVALID_MAPS)
def test_loading_a_checkpoint_with_a_hand_edited_invalid_map_fails_clearly(kind, entries, message, tmp_path):
    kind.tied_model([0, 0, 2, 0]).save_pretrained(tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    config["tying_map"] = entries
    config_path.write_text(json.dumps(config))

    for load in (kind.tied_class.from_pretrained, kind.auto_class.from_pretrained):
        with pytest.raises(ValueError, match=re.escape(message)):
            load(tmp_path)


@every_kind
def test_config_keeps_no_map_as_none_and_stores_maps_canonically(kind):
    config = kind.make_config(None, num_blocks=5)
    assert config.tying_map is None
    assert config.tying == TyingMap.independent(5)

    config = kind.make_config((0, 0, 1, 2))
    assert config.tying_map == [0, 0, 0, 0]
    assert type(config).from_dict(config.to_dict()).tying_map == [0, 0, 0, 0]

    config.tying_map = [0, 1, 1, 2]
    assert config.tying_map == [0, 1, 1, 1]
    with pytest.raises(ValueError, match=r"tying_map\[2\] = 7 is a forward reference"):
        config.tying_map = [0, 1, 7, 2]


@every_kind
def test_a_map_passed_to_from_pretrained_is_validated_and_stored_canonically(kind, tmp_path):
    kind.tied_model([0, 1, 2, 3]).save_pretrained(tmp_path)

    model = kind.tied_class.from_pretrained(tmp_path, tying_map=[0, 0, 1, 2])

    assert model.config.tying_map == [0, 0, 0, 0]
    assert_blocks_share_as(model, [0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"tying_map\[3\] = 9 is a forward reference"):
        kind.tied_class.from_pretrained(tmp_path, tying_map=[0, 0, 1, 9])
    with pytest.raises(ValueError, match="tying_map has 3 entries but the model has 4 blocks"):
        kind.tied_class.from_pretrained(tmp_path, tying_map=[0, 0, 1])


@every_kind
def test_a_config_with_another_map_loads_a_tied_checkpoint_as_tying_map_does(kind, tmp_path):
    """transformers' way to change a setting before loading (`config=`): the blocks the checkpoint stores as ties get
    the weights they were saved sharing, not a fresh initialisation."""
    tied = kind.tied_model([0, 0, 2, 2], seed=3)
    perturb_(tied, seed=4)
    tied.save_pretrained(tmp_path)
    config = type(tied.config).from_pretrained(tmp_path)
    config.tying_map = [0, 1, 2, 3]

    by_config = load_cleanly(kind.tied_class, tmp_path, config=config)
    by_argument = load_cleanly(kind.tied_class, tmp_path, tying_map=[0, 1, 2, 3])

    assert torch.equal(logits(by_config), logits(tied)) and torch.equal(logits(by_argument), logits(tied))
    assert_blocks_share_as(by_config, [0, 1, 2, 3])
    assert config.tying_map == [0, 1, 2, 3] and getattr(config, "_saved_tying_map", None) is None  # the user's, as given


def test_a_config_given_bypasses_a_config_json_whose_map_does_not_parse(tmp_path):
    GPT2.tied_model([0, 1, 2, 3]).save_pretrained(tmp_path)
    config = GPT2.tied_class.config_class.from_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(saved | {"tying_map": [0, 0, 1]}))  # 3 entries for 4 blocks
    assert_blocks_share_as(load_cleanly(GPT2.tied_class, tmp_path, config=config), [0, 1, 2, 3])


def test_a_checkpoint_loaded_with_fewer_layers_ties_them_as_its_map_begins(tmp_path):
    tied = GPT2.tied_model([0, 0, 2, 2], seed=3)
    perturb_(tied, seed=4)
    tied.save_pretrained(tmp_path)

    fewer, loading_info = GPT2.tied_class.from_pretrained(tmp_path, n_layer=2, tying_map=[0, 1], output_loading_info=True)

    assert not loading_info["missing_keys"]  # block 1, stored as a tie to block 0, gets block 0's weights
    for name, parameter in block_parameters(fewer, 1).items():
        assert torch.equal(parameter, block_parameters(tied, 0)[name])


# --- parameter accounting ------------------------------------------------------------------------


@every_kind
@SOME
@given(entries=raw_tying_maps())
def test_parameter_counts_count_each_distinct_parameter_once(kind, entries):
    model = kind.tied_model(entries)
    plain = kind.plain_model(len(entries))
    tying_map = TyingMap(entries)
    per_block = block_numel(plain, kind.blocks_path)
    distinct = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}.values()
    embeddings = sum(module.weight.numel() for module in plain.modules() if isinstance(module, nn.Embedding))
    plain_total = sum(parameter.numel() for parameter in plain.parameters())

    counts = model.parameter_counts()

    assert counts.total == sum(parameter.numel() for parameter in distinct)
    assert counts.total == plain_total - (len(entries) - tying_map.num_distinct) * per_block
    assert counts.blocks == tying_map.num_distinct * per_block
    assert counts.embeddings == embeddings
    assert counts.rest == plain_total - embeddings - len(entries) * per_block > 0
    assert counts.total == counts.embeddings + counts.blocks + counts.rest
    assert counts.trainable == counts.total


def test_trainable_count_leaves_out_frozen_parameters():
    model = GPT2.tied_model([0, 0, 2, 2])
    model.get_input_embeddings().weight.requires_grad_(False)

    counts = model.parameter_counts()

    assert counts.trainable == counts.total - model.get_input_embeddings().weight.numel()


# --- converting checkpoints: plain ones, and tied ones loaded with another map ---------------------


@every_kind
@FEW
@given(entries=raw_tying_maps())
def test_plain_checkpoint_loads_with_each_tied_block_taking_its_roots_weights(kind, entries, tmp_path_factory):
    directory = tmp_path_factory.mktemp("plain")
    plain = kind.plain_model(len(entries), seed=5)
    perturb_(plain, seed=6)
    plain.save_pretrained(directory)

    tied = load_cleanly(kind.tied_class, directory, tying_map=entries)

    tying_map = TyingMap(entries)
    assert_blocks_share_as(tied, tying_map)
    plain_blocks = plain.get_submodule(kind.blocks_path)
    for block, root in enumerate(tying_map):
        for name, parameter in block_parameters(tied, block).items():
            assert torch.equal(parameter, plain_blocks[root].get_parameter(name)), f"block {block} {name}"
    plain_rest = {name: p for name, p in plain.named_parameters() if not name.startswith(kind.blocks_path)}
    tied_rest = {name: p for name, p in tied.named_parameters() if not name.startswith(kind.blocks_path)}
    assert plain_rest.keys() == tied_rest.keys()
    assert all(torch.equal(tied_rest[name], plain_rest[name]) for name in plain_rest)
    if tying_map.num_distinct == len(tying_map):
        assert torch.equal(logits(tied), logits(plain))


@every_kind
@FEW
@given(entries=raw_tying_maps())
def test_plain_checkpoint_converted_with_tie_init_mean_starts_each_group_from_its_average(
    kind, entries, tmp_path_factory
):
    directory = tmp_path_factory.mktemp("plain")
    plain = kind.plain_model(len(entries), seed=5)
    perturb_(plain, seed=6)
    plain.save_pretrained(directory)

    tied = load_cleanly(kind.tied_class, directory, tying_map=entries, tie_init="mean")

    tying_map = TyingMap(entries)
    assert_blocks_share_as(tied, tying_map)
    assert tied.config.tie_init == "mean"
    plain_blocks = plain.get_submodule(kind.blocks_path)
    for root, members in tying_map.groups().items():
        for name, parameter in block_parameters(tied, root).items():
            average = torch.stack([plain_blocks[member].get_parameter(name) for member in members]).mean(dim=0)
            torch.testing.assert_close(parameter, average, rtol=0, atol=1e-6, msg=f"group {root} {name}")


@every_kind
@FEW
@given(maps=map_pairs())
def test_a_tied_checkpoint_loaded_with_another_map_starts_each_group_from_what_its_root_used(
    kind, maps, tmp_path_factory
):
    # Newly independent blocks take the weights they used in the checkpoint instead of a random initialisation.
    saved_map, loaded_map = maps
    directory = tmp_path_factory.mktemp("tied")
    saved = kind.tied_model(saved_map)
    perturb_(saved, seed=9)
    saved.save_pretrained(directory)

    loaded = load_cleanly(kind.tied_class, directory, tying_map=loaded_map.to_list())

    assert_blocks_share_as(loaded, loaded_map)
    for block, root in enumerate(loaded_map):
        for name, parameter in block_parameters(loaded, block).items():
            assert torch.equal(parameter, block_parameters(saved, root)[name]), f"block {block} {name}"
    finer = all(saved_map[block] == saved_map[root] for block, root in enumerate(loaded_map))
    if finer:  # every new group lies inside a saved one: every block computes what it computed
        assert torch.equal(logits(loaded), logits(saved))


@every_kind
def test_a_checkpoint_loaded_with_a_less_tied_map_by_the_auto_class_keeps_its_logits(kind, tmp_path):
    saved = kind.tied_model([0, 0, 0, 3])
    perturb_(saved, seed=10)
    saved.save_pretrained(tmp_path)

    loaded = load_cleanly(kind.auto_class, tmp_path, tying_map=[0, 1, 1, 3])

    assert_blocks_share_as(loaded, [0, 1, 1, 3])
    assert torch.equal(logits(loaded), logits(saved))
    assert json.loads((tmp_path / "config.json").read_text())["tying_map"] == [0, 0, 0, 3]


def test_tie_init_mean_on_a_tied_checkpoint_weights_each_block_by_what_it_used(tmp_path):
    saved = GPT2.tied_model([0, 0, 0, 3])
    perturb_(saved, seed=11)
    saved.save_pretrained(tmp_path)

    loaded = load_cleanly(GPT2.tied_class, tmp_path, tying_map=[0, 0, 0, 0], tie_init="mean")

    for name, parameter in block_parameters(loaded, 0).items():
        expected = (3 * block_parameters(saved, 0)[name] + block_parameters(saved, 3)[name]) / 4
        torch.testing.assert_close(parameter, expected, rtol=0, atol=1e-6)


def test_a_checkpoint_s_saved_tie_init_regrouping_from_roots_says_so(tmp_path, caplog):
    saved = GPT2.tied_model([0, 0, 0, 3])
    saved.config.tie_init = "mean"  # as a checkpoint converted with mean records it
    saved.save_pretrained(tmp_path)
    with caplog.at_level("WARNING"):
        loaded = load_cleanly(GPT2.tied_class, tmp_path, tying_map=[0, 0, 0, 0])
    assert loaded.config.tie_init == "root"
    assert "tie_init='mean' is the value the checkpoint was saved with" in caplog.text
    assert torch.equal(block_parameters(loaded, 0)["attn.c_attn.weight"], block_parameters(saved, 0)["attn.c_attn.weight"])


def test_a_quantized_load_is_refused_rather_than_left_mostly_unquantized(tmp_path):
    """transformers keeps tied weights out of quantization: every tied group's would stay in full precision."""
    from transformers import BitsAndBytesConfig

    GPT2.tied_model([0, 0, 2, 2]).save_pretrained(tmp_path)
    for load in (GPT2.tied_class.from_pretrained, GPT2.auto_class.from_pretrained):
        with pytest.raises(ValueError, match=r"quantization_config=\.\.\.\): transformers keeps every tied weight out of quantization"):
            load(tmp_path, quantization_config=BitsAndBytesConfig(load_in_4bit=True))


def test_similarity_s_map_refuses_a_number_of_distinct_blocks_that_is_not_an_integer():
    from hf_layertie.block_similarity import similarity_tying_map

    for value in (2.0, True):
        with pytest.raises(ValueError, match=rf"num_distinct must be an integer >= 1 .*got {value!r}"):
            similarity_tying_map([0.3, 0.2, 0.1], value)


def test_a_plain_transformers_config_is_refused_naming_the_conversion():
    plain = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50)
    with pytest.raises(TypeError, match=r"TiedGPT2LMHeadModel needs a TiedGPT2Config, got config=GPT2Config: convert it with TiedGPT2Config.from_dict\(\{\*\*config.to_dict\(\), 'model_type': 'tied_gpt2'\}\)"):
        GPT2.tied_class(plain)


def test_a_folder_with_adapters_is_refused_without_peft_rather_than_loaded_without_them(tmp_path, monkeypatch):
    GPT2.tied_model([0, 0, 2, 2]).save_pretrained(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "peft" else real_find_spec(name, *args))
    with pytest.raises(ImportError, match=r"holds PEFT adapters \(relaxed ties\) beside its tied base, and PEFT is not installed"):
        GPT2.tied_class.from_pretrained(tmp_path)


@pytest.mark.parametrize("value", ["average", None, 1])
def test_config_rejects_an_unknown_tie_init(value):
    with pytest.raises(ValueError, match=rf"tie_init must be one of \('root', 'mean'\), got {re.escape(repr(value))}"):
        GPT2.make_config([0, 0], tie_init=value)


# --- exporting plain transformers models ---------------------------------------------------------


@every_kind
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_to_untied_in_half_precision_keeps_the_logits_and_the_buffers_dtypes(kind, dtype, tmp_path):
    kind.tied_model([0, 0, 2, 2]).save_pretrained(tmp_path)
    model = kind.tied_class.from_pretrained(tmp_path, dtype=dtype).eval()

    plain = model.to_untied()

    assert {name: buffer.dtype for name, buffer in plain.named_buffers()} == {
        name: buffer.dtype for name, buffer in model.named_buffers()
    }  # rotary inv_freq stays float32, as transformers keeps it
    assert all(parameter.dtype == dtype for parameter in plain.parameters())
    assert torch.equal(logits(plain), logits(model))


@every_kind
def test_to_untied_keeps_the_attention_implementation_and_the_frozen_weights(kind):
    model = kind.tied_model([0, 0, 2, 2], attn_implementation="eager")
    model.get_input_embeddings().weight.requires_grad_(False)

    plain = model.to_untied()

    assert plain.config._attn_implementation == "eager"
    inputs = torch.arange(8).unsqueeze(0)
    assert len(plain(inputs, output_attentions=True).attentions) == 4  # sdpa returns no attention weights
    assert not plain.get_input_embeddings().weight.requires_grad
    assert all(parameter.requires_grad for parameter in plain.get_submodule(kind.blocks_path).parameters())


@every_kind
@FEW
@given(entries=raw_tying_maps())
def test_to_untied_gives_the_plain_class_with_a_copy_per_block_and_the_same_logits(kind, entries, tmp_path_factory):
    model = kind.tied_model(entries)
    perturb_(model, seed=12)

    plain = model.to_untied()

    assert type(plain) is kind.plain_class
    assert not plain.training
    blocks = plain.get_submodule(kind.blocks_path)
    storages = [parameter.data_ptr() for block in blocks for parameter in block.parameters()]
    assert len(storages) == len(set(storages)) == len(entries) * len(block_parameters(model, 0))
    for block, root in enumerate(TyingMap(entries)):
        for name, parameter in blocks[block].named_parameters():
            assert torch.equal(parameter, block_parameters(model, root)[name])
    assert torch.equal(logits(plain), logits(model))
    assert_blocks_share_as(model, entries)  # the tied model is left as it was

    directory = tmp_path_factory.mktemp("untied")
    plain.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == kind.name and config["architectures"] == [kind.plain_class.__name__]
    assert not {"tying_map", "tie_init", "auto_map"} & config.keys()
    assert load_file(directory / "model.safetensors").keys() == plain_checkpoint(
        kind, len(entries), tmp_path_factory.getbasetemp()
    ).keys()
    assert torch.equal(logits(load_cleanly(kind.plain_class, directory)), logits(model))


# --- the map belongs to the model once it is built -----------------------------------------------


@every_kind
def test_assigning_the_map_of_a_built_model_is_refused_and_changes_nothing(kind, tmp_path):
    model = kind.tied_model([0, 0, 2, 2])
    perturb_(model, seed=13)
    expected = logits(model)

    for assign in (
        lambda: setattr(model.config, "tying_map", [0, 0, 0, 0]),
        lambda: model.config.update({"tying_map": [0, 1, 2, 3]}),
        lambda: model.config.update_from_string("tying_map=0"),
    ):
        with pytest.raises(ValueError, match=re.escape("Call model.retie(new_map) instead")):
            assign()

    assert_blocks_share_as(model, [0, 0, 2, 2])
    model.save_pretrained(tmp_path)
    assert torch.equal(logits(load_cleanly(kind.tied_class, tmp_path)), expected)


def test_the_map_of_a_config_whose_model_is_gone_can_be_assigned_even_if_a_cycle_still_holds_the_model():
    config = GPT2.make_config([0, 0, 2, 2])
    model = GPT2.tied_class(config)
    model.cycle = [model]  # freed only by the garbage collector, as a model held by an exception's traceback
    del model

    config.tying_map = [0, 1, 2, 2]

    assert GPT2.tied_class(config).tying_map.to_list() == [0, 1, 2, 2]


def test_retie_updates_the_config_and_only_configs_no_model_is_built_on_accept_a_map():
    config = GPT2.make_config([0, 0, 2, 2])
    config.tying_map = [0, 1, 2, 2]  # not built on yet
    model = GPT2.tied_class(config)

    model.retie([0, 0, 0, 3])
    assert config.tying_map == [0, 0, 0, 3]

    detached = copy.deepcopy(config)
    detached.tying_map = [0, 1, 2, 3]
    assert model.config.tying_map == [0, 0, 0, 3]
    assert_blocks_share_as(model, [0, 0, 0, 3])
    with pytest.warns(UserWarning, match=r"this config already drives a TiedGPT2LMHeadModel: the new TiedGPT2LMHeadModel is built on a copy of it"):
        second = GPT2.tied_class(config)
    assert second.config is not config and second.config.tying_map == [0, 0, 0, 3]
    second.retie([0, 1, 2, 3])
    assert config.tying_map == [0, 0, 0, 3] and model.tying_map.to_list() == [0, 0, 0, 3]


def test_a_trainer_s_model_init_builds_each_model_on_one_config(tmp_path):
    """transformers' `Trainer` builds the model of `model_init` again in `train()`, while the first one is held."""
    config = GPT2.make_config([0, 0, 2, 2])
    dataset = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4]] * 8, "labels": [[1, 2, 3, 4]] * 8})
    args = TrainingArguments(str(tmp_path), max_steps=1, per_device_train_batch_size=4, use_cpu=True, report_to=[])
    with pytest.warns(UserWarning, match="this config already drives"):
        trainer = Trainer(model_init=lambda: GPT2.tied_class(config), args=args, train_dataset=dataset)
        assert trainer.train().global_step == 1
    assert_blocks_share_as(trainer.model, [0, 0, 2, 2])


def test_a_shallow_copy_shares_its_original_s_blocks_and_config():
    model = GPT2.tied_model([0, 0, 2, 2])
    view = copy.copy(model)
    assert view.config is model.config and view.tied_blocks is model.tied_blocks
    view.retie([0, 1, 2, 3])
    assert model.tying_map.to_list() == [0, 1, 2, 3]
    assert_blocks_share_as(model, [0, 1, 2, 3])


def test_a_copied_or_pickled_model_owns_its_own_config():
    model = GPT2.tied_model([0, 0, 2, 2])
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.config is not model.config
        with pytest.raises(ValueError, match="Call model.retie"):
            clone.config.tying_map = [0, 1, 2, 3]
        clone.retie([0, 1, 2, 3])
        assert_blocks_share_as(clone, [0, 1, 2, 3])
        assert_blocks_share_as(model, [0, 0, 2, 2])


def test_the_binding_stays_out_of_serialisation_and_comparisons(tmp_path):
    model = GPT2.tied_model([0, 0, 2, 2])
    unbound = GPT2.make_config([0, 0, 2, 2])
    bound = model.config

    assert bound.to_dict() == unbound.to_dict()
    assert bound == unbound == copy.deepcopy(bound) == pickle.loads(pickle.dumps(bound))
    copy.deepcopy(bound).tying_map = [0, 1, 2, 3]
    pickle.loads(pickle.dumps(bound)).tying_map = [0, 1, 2, 3]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["tying_map"] == [0, 0, 2, 2]
    loaded_config = AutoConfig.from_pretrained(tmp_path, tying_map=[0, 1, 2, 3])
    assert loaded_config.to_dict() == AutoConfig.from_pretrained(tmp_path, tying_map=[0, 1, 2, 3]).to_dict()
    assert "_saved_tying_map" not in json.dumps(loaded_config.to_dict())


# --- generation ----------------------------------------------------------------------------------


@causal_kinds
@pytest.mark.parametrize("entries", [[0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 2, 2], [0, 1, 2, 3]])
def test_generate_gives_the_same_tokens_with_and_without_kv_cache(kind, entries):
    # Every position keeps its own module: its KV cache slot (layer_idx) and, for Qwen2 and Mistral, its
    # attention window (Qwen2 slides from layer 2 on, so [0, 0, 0, 0] ties sliding layers to a full one).
    model = kind.tied_model(entries)
    perturb_(model, seed=7)
    plain = kind.plain_model(len(entries))
    prompt = INPUT_IDS[:, :5]

    def per_position(blocks: nn.ModuleList) -> list[tuple]:
        return [
            (module.layer_idx, getattr(module, "sliding_window", None))
            for block in blocks
            for module in block.modules()
            if hasattr(module, "layer_idx")
        ]

    def greedy(use_cache: bool) -> torch.Tensor:
        return model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False, use_cache=use_cache
        )

    assert per_position(model.tied_blocks) == per_position(plain.get_submodule(kind.blocks_path))
    with_cache = greedy(use_cache=True)
    assert with_cache.shape == (2, 5 + 12)
    assert torch.equal(with_cache, greedy(use_cache=False))


# --- Auto classes --------------------------------------------------------------------------------


def test_every_tied_model_class_is_covered_by_these_tests():
    assert {kind.tied_class for kind in EVERY_KIND} == {model_class for model_class, _ in TIED_MODELS.values()}


@every_kind
def test_auto_classes_build_the_tied_classes(kind):
    config = AutoConfig.for_model(kind.tied_class.config_class.model_type, num_hidden_layers=4, tying_map=[0, 0, 1, 3])
    assert type(config) is kind.tied_class.config_class and config.tying_map == [0, 0, 0, 3]

    model = kind.auto_class.from_config(kind.make_config([0, 0, 1, 3]))
    assert type(model) is kind.tied_class
    assert_blocks_share_as(model, [0, 0, 0, 3])


@every_kind
def test_auto_classes_load_a_saved_tied_checkpoint(kind, tmp_path):
    model = kind.tied_model([0, 1, 0, 1])
    perturb_(model, seed=8)
    model.save_pretrained(tmp_path)

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == f"tied_{kind.name}"
    assert config["auto_map"][kind.auto_class.__name__].endswith(f".{kind.tied_class.__name__}")
    assert type(AutoConfig.from_pretrained(tmp_path)) is kind.tied_class.config_class
    reloaded = load_cleanly(kind.auto_class, tmp_path)
    assert type(reloaded) is kind.tied_class
    assert_blocks_share_as(reloaded, [0, 1, 0, 1])
    assert torch.equal(logits(reloaded), logits(model))


# --- gradient checkpointing ----------------------------------------------------------------------


def gradients_and_saved_bytes(model: PreTrainedModel) -> tuple[dict[str, torch.Tensor], int]:
    """Each distinct Parameter's gradient after one forward and backward pass, and the bytes the forward pass saved
    for the backward outside checkpointed blocks (a checkpointed block saves nothing: it recomputes)."""
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=INPUT_IDS, labels=INPUT_IDS).loss
    loss.backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}, sum(saved)


@pytest.mark.parametrize(
    ("kind", "no_dropout"), [(GPT2, dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)), (LLAMA, {})], ids=["gpt2", "llama"]
)
def test_gradient_checkpointing_on_before_a_retie_stays_on_and_gives_the_same_gradients(kind, no_dropout):
    # What the memory guide pairs with tying: the Trainer turns checkpointing on at the start, the agent re-ties
    # later. The recompute must go through the blocks' shared Parameters as the map now has them, copies included.
    model = kind.tied_model(parse_strategy("cycle:3", 6).to_list(), **no_dropout).train()  # checkpoints in training only
    model.gradient_checkpointing_enable()
    assert model.retie([0, 1, 2, 3, 3, 3]).copied_from  # blocks 3-5 share a fresh copy of block 0's weights
    perturb_(model, seed=5)  # the copy and its source differ, so a gradient reaching the wrong one shows
    checkpointed, saved_checkpointed = gradients_and_saved_bytes(model)
    model.gradient_checkpointing_disable()
    plain, saved_plain = gradients_and_saved_bytes(model)

    assert checkpointed.keys() == plain.keys()
    assert all(torch.equal(checkpointed[name], plain[name]) for name in plain), "checkpointing changed a gradient"
    assert saved_checkpointed < saved_plain / 2, "checkpointing was off after the re-tie"


# --- training with transformers' Trainer ---------------------------------------------------------


def optimizer_state_after_one_step(model: PreTrainedModel, output_dir: Path) -> dict:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ids = torch.randint(1, TINY_GPT2["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(9)).tolist()
    arguments = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's AcceleratedOptimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    return optimizer.state


def test_trainer_keeps_optimizer_state_for_distinct_parameters_only(tiny_gpt2_config, tmp_path):
    num_blocks = 12
    torch.manual_seed(0)
    all_tied = TiedGPT2LMHeadModel(tiny_gpt2_config([0] * num_blocks))
    torch.manual_seed(0)
    untied = TiedGPT2LMHeadModel(tiny_gpt2_config(None, num_blocks=num_blocks))
    per_block = len(list(all_tied.tied_blocks[0].parameters()))
    non_block = len(list(untied.parameters())) - num_blocks * per_block

    for model, distinct_blocks in ((all_tied, 1), (untied, num_blocks)):
        state = optimizer_state_after_one_step(model, tmp_path / str(distinct_blocks))
        parameters = {id(parameter) for parameter in model.parameters()}

        assert len(state) == non_block + distinct_blocks * per_block
        assert {id(parameter) for parameter in state} == parameters
        assert all(state[parameter]["step"] == 1 for parameter in state)
    assert_blocks_share_as(all_tied, [0] * num_blocks)


def test_a_config_map_that_disagrees_with_the_weights_file_is_refused_naming_the_blocks(tmp_path):
    """config.json says 0 0 2 2, the weights file holds four blocks of their own (a map edited by hand): loading
    would drop blocks 1 and 3 silently. Refused; the way on it names reads every block."""
    torch.manual_seed(0)
    untied = TiedGPT2LMHeadModel(make_tiny_gpt2_config(num_blocks=4, n_embd=32))
    untied.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tying_map": [0, 0, 2, 2]}))
    with pytest.raises(ValueError, match=r"holds weights of block\(s\) 1, 3, which the map in its config.json \(0 0 2 2\) ties to another block"):
        TiedGPT2LMHeadModel.from_pretrained(tmp_path)
    every_block = TiedGPT2LMHeadModel.from_pretrained(tmp_path, tying_map=[0, 1, 2, 3]).eval()
    batch = torch.randint(0, 100, (2, 8))
    assert torch.equal(every_block(input_ids=batch).logits, untied.eval()(input_ids=batch).logits)
