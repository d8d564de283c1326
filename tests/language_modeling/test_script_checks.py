"""Settings that `run_clm.py` used to ignore, accept or fail on late: each is refused at once, naming the flag, the
value and what to do, before anything is trained or generated."""

import json
import re

import pytest
import torch
from helpers.scripts import TINY_GPT2, tiny_flags, tiny_task_flags
from transformers import GPT2Config, GPT2LMHeadModel

from hf_layertie import TIED_MODELS
from hf_layertie.language_modeling import CAUSAL_LM, MASKED_LM, generated_tasks, run
from hf_layertie.language_modeling.run import parse_arguments
from hf_layertie.toolkit import load_tokenizer, tied_model_type
from hf_layertie.toolkit.models import load_model, small_size_overrides


@pytest.fixture
def generation_forbidden(monkeypatch):
    """Every generated task fails if its examples are generated: the refusals must come first."""

    def generate(config, seed=0):
        raise AssertionError("examples were generated before the settings were checked")

    for name, task in list(generated_tasks.HOP_TASKS.items()):
        monkeypatch.setitem(generated_tasks.HOP_TASKS, name, task._replace(make_datasets=generate))


@pytest.fixture(scope="module")
def plain_gpt2_checkpoints(tmp_path_factory):
    """Two plain GPT-2 checkpoints of 3 blocks (different weights) with the shipped tokenizer."""
    tokenizer = load_tokenizer("shakespeare-bpe")
    folders = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"plain{seed}")
        config = GPT2Config(n_layer=3, n_embd=16, n_head=2, n_positions=32, vocab_size=len(tokenizer))
        torch.manual_seed(seed)
        GPT2LMHeadModel(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


# --- 3. settings silently ignored or wrongly accepted -----------------------------------------------


def test_a_lora_rank_that_cannot_compress_is_refused_before_training(tmp_path, text_files):
    flags = tiny_flags(tmp_path, text_files, TINY_GPT2, "--tying_strategy", "static:all", "--lora_rank", "1000")
    with pytest.raises(ValueError) as refusal:
        run(CAUSAL_LM, flags)
    message = str(refusal.value)
    # Both limits named: the blocks' smaller layer dimension (16), and the largest rank at which 3 positions sharing
    # one block's weights, each with its LoRA, stay smaller than 3 untied blocks (8).
    assert "lora_rank=1000 does not compress this model: ranks must stay below 16" in message
    assert "at or below 8, above which the relaxed blocks (1 of 3 owning weights" in message
    assert message.endswith("pass lora_rank=8 or less")
    assert not (tmp_path / "trainer_state.json").exists() and not list(tmp_path.glob("checkpoint-*"))


def test_resuming_an_untie_own_run_from_another_model_is_refused_naming_both(tmp_path, text_files, plain_gpt2_checkpoints):
    first, other = plain_gpt2_checkpoints

    def flags(model, max_steps):
        common = tiny_flags(tmp_path, text_files, "", "--untie_init", "own", "--save_steps", "2", "--do_eval", "false")
        common = [flag for flag in common if flag not in ("--config_overrides", "")]
        return [*common, "--max_steps", str(max_steps), "--model_name_or_path", str(model)]

    run(CAUSAL_LM, flags(first, 4))
    saved = {path: path.read_bytes() for path in (tmp_path / "checkpoint-4").iterdir() if path.is_file()}
    with pytest.raises(ValueError, match=rf"started from {re.escape(str(first.resolve()))} .* comes from {re.escape(str(other.resolve()))}"):
        run(CAUSAL_LM, flags(other, 6))  # resumes from checkpoint-4 with the other model
    assert {path: path.read_bytes() for path in saved} == saved
    assert not (tmp_path / "checkpoint-6").exists()


@pytest.mark.parametrize("task", sorted(generated_tasks.HOP_TASKS))
@pytest.mark.parametrize("flag", ["--block_size", "--train_file", "--validation_file", "--validation_split_percentage", "--keep_linebreaks"])
def test_text_only_flags_are_refused_with_a_generated_task(tmp_path, text_files, generation_forbidden, task, flag):
    value = {"--block_size": "32", "--validation_split_percentage": "50", "--keep_linebreaks": "false"}.get(flag, str(text_files / "train.txt"))
    with pytest.raises(ValueError, match=rf"--dataset_name {task} generates its examples.* reads no {flag}\. Leave it unset"):
        run(CAUSAL_LM, tiny_task_flags(tmp_path, task, "", flag, value))


@pytest.mark.parametrize("script", [CAUSAL_LM, MASKED_LM], ids=["run_clm", "run_mlm"])
def test_a_removed_generated_task_is_refused_naming_the_tasks_there_are(tmp_path, generation_forbidden, script):
    """`multihop` was a generated task: its name is refused as such, not looked up as a Hub dataset."""
    message = r"--dataset_name multihop: the generated task multihop \(chains of variable references, .*\) is no longer offered; the generated tasks are hop_induction, word_problem$"
    with pytest.raises(ValueError, match=message):
        parse_arguments(script, ["--dataset_name", "multihop", "--output_dir", str(tmp_path), "--do_train"])
    assert set(generated_tasks.REMOVED_TASKS).isdisjoint(generated_tasks.HOP_TASKS)


def test_a_tokenizer_is_refused_with_a_generated_task(tmp_path, generation_forbidden):
    with pytest.raises(ValueError, match=r"--dataset_name hop_induction generates its examples with its own word-level tokenizer: it reads no --tokenizer_name \(gpt2\)"):
        run(CAUSAL_LM, tiny_task_flags(tmp_path, "hop_induction", "", "--tokenizer_name", "gpt2"))


def test_a_dataset_and_files_together_are_refused_naming_both(tmp_path, text_files):
    validation = str(text_files / "validation.txt")
    with pytest.raises(ValueError, match=rf"--dataset_name wikitext and --validation_file {re.escape(validation)} both name the data"):
        parse_arguments(CAUSAL_LM, ["--dataset_name", "wikitext", "--validation_file", validation, "--output_dir", str(tmp_path), "--do_eval"])


def test_an_evaluation_without_a_model_to_score_is_refused(tmp_path):
    """It would score a model built from scratch, and write its numbers into the folder named."""
    with pytest.raises(ValueError, match=rf"--do_eval without --do_train scores the model of --model_name_or_path, and none was given.*e\.g\. {re.escape(str(tmp_path))}"):
        parse_arguments(CAUSAL_LM, ["--do_train", "false", "--do_eval", "--output_dir", str(tmp_path)])


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--tying_strategy", "static:all"], "--tying_strategy is"),
        (["--tying_interval", "5"], "--tying_interval is"),
        (["--tying_strategy", "random", "--tying_interval", "5"], "--tying_strategy, --tying_interval are"),
        (["--distill_from", "teacher"], "--distill_from is"),
    ],
)
def test_tying_and_distillation_settings_on_an_evaluation_alone_are_refused(tmp_path, flags, named):
    """Evaluation scores the checkpoint with its saved map and no teacher: the settings would be dropped unread."""
    evaluation = ["--model_name_or_path", "never-loaded", "--output_dir", str(tmp_path), "--do_eval"]
    with pytest.raises(ValueError, match=rf"^{named} read only in training, and this run does not pass --do_train"):
        parse_arguments(CAUSAL_LM, [*evaluation, *flags])
    for strategy in ("dlt", "none"):  # the default, and what evaluation runs with: nothing is dropped
        parse_arguments(CAUSAL_LM, [*evaluation, "--tying_strategy", strategy])
    parse_arguments(CAUSAL_LM, [*evaluation, *flags, "--do_train"])


def test_streaming_with_several_loader_workers_is_refused_where_rows_are_held_out_by_index(tmp_path):
    """Each worker would count the stream's rows from 0: the validation rows it skips would not be those evaluated.
    A source with a validation split of its own holds out nothing by index: several workers may read it."""
    (tmp_path / "own").mkdir()
    (tmp_path / "train_only").mkdir()
    for folder, splits in (("own", ("train", "validation")), ("train_only", ("train",))):
        for split in splits:
            (tmp_path / folder / f"{split}.txt").write_text("some text\n" * 20)
    streamed = ["--streaming", "--max_steps", "4", "--max_eval_samples", "4", "--dataloader_num_workers", "2", "--do_train",
                "--do_eval", "--output_dir", str(tmp_path / "run")]  # fmt: skip
    refused = "--streaming with --dataloader_num_workers 2: each worker reads its own shards"
    for data in (["--dataset_name", str(tmp_path / "train_only")], ["--train_file", str(tmp_path / "train_only" / "train.txt")]):
        with pytest.raises(ValueError, match=refused):
            parse_arguments(CAUSAL_LM, [*streamed, *data])
    with pytest.raises(ValueError, match=refused):  # a held-out reward's blocks are held out by index
        parse_arguments(CAUSAL_LM, [*streamed, "--dataset_name", str(tmp_path / "own"), "--reward_source", "held_out"])
    for data in (["--dataset_name", str(tmp_path / "own")], []):  # the embedded corpus has its validation plays
        parse_arguments(CAUSAL_LM, [*streamed, *data])


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_settings_file_without_data_or_model_builds_on_the_embedded_default_as_flags_do(tmp_path, suffix):
    settings = {"max_steps": 50, "output_dir": str(tmp_path / "out"), "do_train": True, "config_overrides": "n_layer=2"}
    path = tmp_path / f"settings{suffix}"
    path.write_text(json.dumps(settings))  # JSON is YAML too
    from_file = parse_arguments(CAUSAL_LM, [str(path)])
    from_flags = parse_arguments(CAUSAL_LM, ["--max_steps", "50", "--output_dir", str(tmp_path / "out"), "--do_train", "--config_overrides", "n_layer=2"])
    assert from_file == from_flags
    assert from_file[0].config_overrides == json.loads(CAUSAL_LM.default_arguments.read_text())["config_overrides"] + ",n_layer=2"
    own = dict(settings, train_file="train.txt")
    path.write_text(json.dumps(own))
    assert parse_arguments(CAUSAL_LM, [str(path)])[0].config_overrides == "n_layer=2"  # one's own data: no default


@pytest.mark.parametrize("task, config", [("hop_induction", "length=8,max_hops=2,length=9")])
def test_a_task_setting_given_twice_is_refused(tmp_path, generation_forbidden, task, config):
    key = config.split("=")[0]
    with pytest.raises(ValueError, match=rf"--dataset_config_name '{config}': {task} setting '{key}' is given twice"):
        run(CAUSAL_LM, tiny_task_flags(tmp_path, task, config))


# --- 4. hangs on bad input --------------------------------------------------------------------------


def test_a_model_type_that_disagrees_with_the_checkpoint_is_refused_before_building(tmp_path, plain_gpt2_checkpoints, monkeypatch):
    checkpoint = plain_gpt2_checkpoints[0]

    def build(*args, **kwargs):
        raise AssertionError("a Llama was built from the GPT-2 config")

    monkeypatch.setattr(TIED_MODELS["tied_llama"][0], "from_pretrained", build)
    flags = ["--model_name_or_path", str(checkpoint), "--model_type", "tied_llama", "--output_dir", str(tmp_path), "--do_eval"]
    with pytest.raises(ValueError, match=rf"--model_type tied_llama does not match --model_name_or_path {checkpoint}, a 'gpt2' checkpoint"):
        run(CAUSAL_LM, flags)
    assert tied_model_type(str(checkpoint), "tied_gpt2") == tied_model_type(str(checkpoint)) == "tied_gpt2"


@pytest.mark.parametrize("task, tokens", [("hop_induction", "66,000,000,000")])
def test_task_sizes_beyond_the_bound_are_refused_before_generating(tmp_path, generation_forbidden, task, tokens):
    message = rf"{task} train_examples=1000000000 makes a split of {tokens} tokens .* pass train_examples=\d+ or less"
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, tiny_task_flags(tmp_path, task, "train_examples=1000000000"))


@pytest.mark.parametrize("task, needed", [("hop_induction", 66)])
def test_a_context_too_short_for_the_task_is_refused_before_generating(tmp_path, generation_forbidden, task, needed):
    with pytest.raises(ValueError, match=rf"--dataset_name {task} with the default settings needs {needed} positions; the model has 32"):
        run(CAUSAL_LM, tiny_task_flags(tmp_path, task, ""))


# --- 6. unclear errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["absolute", "./relative/model"])
def test_a_missing_model_folder_is_named(tmp_path, missing):
    path = str(tmp_path / "no-such-model") if missing == "absolute" else missing
    flags = ["--model_name_or_path", path, "--output_dir", str(tmp_path), "--do_train"]
    with pytest.raises(ValueError, match=rf"--model_name_or_path {path}: no such folder"):
        run(CAUSAL_LM, flags)


def test_default_tying_settings_the_chosen_strategy_does_not_read_drop_out():
    _, _, training_args = parse_arguments(CAUSAL_LM, ["--tying_strategy", "static:cycle:2"])
    assert training_args.tying_strategy == "static:cycle:2" and training_args.tying_interval is None
    _, _, default = parse_arguments(CAUSAL_LM, [])
    assert default.tying_interval == json.loads(CAUSAL_LM.default_arguments.read_text())["tying_interval"]


@pytest.mark.parametrize("spelling", [["--tying_interval", "4"], ["--tying-interval=4"]])
def test_a_tying_setting_the_user_sets_for_a_strategy_that_does_not_read_it_is_still_refused(spelling):
    with pytest.raises(ValueError, match="tying_strategy='static:cycle:2' does not read tying_interval"):
        parse_arguments(CAUSAL_LM, ["--tying_strategy", "static:cycle:2", *spelling])


@pytest.mark.parametrize("spelling", [["--dataset-name", "wikitext"], ["--dataset_nam", "wikitext"], ["--dataset_name=wikitext"]])
def test_naming_one_s_own_data_under_any_spelling_leaves_the_embedded_default_out(spelling):
    _, data, training_args = parse_arguments(CAUSAL_LM, [*spelling, "--output_dir", "out", "--do_train"])
    assert data.dataset_name == "wikitext"
    assert training_args.output_dir == "out" and training_args.max_steps != json.loads(CAUSAL_LM.default_arguments.read_text())["max_steps"]


@pytest.mark.parametrize("flag", ["--config_overrides", "--config-overrides"])
def test_config_overrides_on_the_default_apply_after_its_own_under_either_spelling(flag):
    model, _, _ = parse_arguments(CAUSAL_LM, [flag, "n_layer=2"])
    assert model.config_overrides == json.loads(CAUSAL_LM.default_arguments.read_text())["config_overrides"] + ",n_layer=2"


@pytest.mark.parametrize("model_type", ["tied_gpt2", "tied_bert"])
def test_a_tokenizer_larger_than_the_checkpoint_s_vocabulary_gets_an_embedding_row_per_token(tmp_path, model_type):
    """As transformers' run_clm.py: otherwise the first token id past the table fails inside the forward pass."""
    from transformers import BertConfig, BertForMaskedLM

    from hf_layertie.toolkit import load_model

    masked = model_type == "tied_bert"
    small = dict(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    plain = BertForMaskedLM(BertConfig(**small)) if masked else GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=100))
    plain.save_pretrained(tmp_path)
    tokenizer = load_tokenizer("shakespeare-wordpiece" if masked else "shakespeare-bpe", masked=masked)
    model = load_model(model_type, tokenizer, str(tmp_path))
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) > 100
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    logits = model(input_ids=torch.tensor([[len(tokenizer) - 1, 5]])).logits
    assert logits.shape[-1] == len(tokenizer)


def test_a_relaxed_checkpoint_is_resized_too_its_blocks_still_sharing(tmp_path):
    """Adapters wrap the tied blocks' layers: the resize's re-tie must leave the blocks' shared objects alone."""
    from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
    from hf_layertie.relaxed_ties import relax_ties
    from hf_layertie.toolkit import load_model

    model = TiedGPT2LMHeadModel(TiedGPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=100, tying_map=[0, 0]))
    relax_ties(model, 2, "zero")
    model.save_pretrained(tmp_path)
    tokenizer = load_tokenizer("shakespeare-bpe")
    loaded = load_model("tied_gpt2", tokenizer, str(tmp_path))
    assert loaded.get_input_embeddings().weight.shape[0] == len(tokenizer) > 100
    blocks = loaded.tied_blocks
    assert blocks[1].mlp.c_fc.base_layer.weight is blocks[0].mlp.c_fc.base_layer.weight
    assert blocks[1].mlp.c_fc.lora_A["default"].weight is not blocks[0].mlp.c_fc.lora_A["default"].weight  # each its own
    assert loaded(input_ids=torch.tensor([[len(tokenizer) - 1, 5]])).logits.shape[-1] == len(tokenizer)


@pytest.mark.parametrize("masked", [False, True])
def test_a_folder_without_tokenizer_files_is_refused_naming_the_flag(tmp_path, masked):
    """GPT-2's loads as one token, BERT's as its five special tokens: neither is a vocabulary to train on."""
    from transformers import BertConfig, BertForMaskedLM

    small = dict(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    plain = BertForMaskedLM(BertConfig(**small)) if masked else GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=100))
    plain.save_pretrained(tmp_path)  # weights only
    with pytest.raises(ValueError, match=rf"--model_name_or_path {re.escape(str(tmp_path))}: no tokenizer there"):
        load_tokenizer(str(tmp_path), masked=masked, flag="--model_name_or_path")


def test_a_corrupt_checkpoint_index_is_named_whatever_its_error_type(tmp_path):
    """json's JSONDecodeError takes more than a message: the error naming the flag must not itself fail."""
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=100)).save_pretrained(tmp_path, max_shard_size="20KB")
    (tmp_path / "model.safetensors.index.json").write_text("{ not json")
    with pytest.raises(ValueError, match=rf"--model_name_or_path {re.escape(str(tmp_path))}: could not load"):
        run(CAUSAL_LM, ["--model_name_or_path", str(tmp_path), "--tokenizer_name", "gpt2", "--output_dir", str(tmp_path / "o"), "--do_eval", "--max_eval_samples", "2"])


def test_run_mlm_masks_the_share_given_else_bert_s():
    assert parse_arguments(MASKED_LM, [])[1].masked_share == 0.15
    assert parse_arguments(MASKED_LM, ["--mlm_probability", "0.3"])[1].masked_share == 0.3


@pytest.mark.parametrize("share", ["0.3", "0.15"])
def test_run_clm_refuses_a_masking_share_it_would_ignore(share):
    """Given at all, even at run_mlm.py's default: the user asked for masking run_clm.py does not do."""
    with pytest.raises(ValueError, match=rf"--mlm_probability {share}: run_clm.py predicts each next token and masks nothing"):
        parse_arguments(CAUSAL_LM, ["--mlm_probability", share])


@pytest.mark.parametrize("model_type", list(TIED_MODELS))
def test_every_size_the_package_suggests_builds_trains_saves_and_reloads(tmp_path, model_type):
    """A from-scratch config is built from the overrides, so that derived fields follow (Llama's and Mistral's
    head_dim, Qwen2's layer_types, the key-value heads): the suggested size (`small_size_overrides`, which the
    size refusal prints) at a depth other than the default trains a step, saves and reloads to the same logits."""
    config_class = TIED_MODELS[model_type][0].config_class
    masked = model_type == "tied_bert"
    tokenizer = load_tokenizer("shakespeare-wordpiece" if masked else "shakespeare-bpe", masked=masked)
    depth = config_class.attribute_map.get("num_hidden_layers", "num_hidden_layers")
    model = load_model(model_type, tokenizer, config_overrides=f"{small_size_overrides(config_class)},{depth}=3")
    assert model.config.num_hidden_layers == 3
    assert model.config.hidden_size // model.config.num_attention_heads == 24
    if hasattr(model.config, "head_dim"):
        assert model.config.head_dim == 24
    if hasattr(model.config, "num_key_value_heads"):
        assert model.config.num_key_value_heads == 4
    batch = torch.randint(5, len(tokenizer), (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=batch, labels=batch).loss.backward()
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded(input_ids=batch).logits, model.eval()(input_ids=batch).logits)


@pytest.mark.parametrize("model_type", ["tied_llama", "tied_mistral", "tied_qwen2"])
def test_overrides_of_width_and_heads_size_the_attention(model_type):
    """The issue's case: 4 blocks of width 32 and 2 heads make q/k/v 32 x 32, not 256 x 32 (head_dim kept at 128)."""
    tokenizer = load_tokenizer("shakespeare-bpe")
    overrides = "num_hidden_layers=4,hidden_size=32,num_attention_heads=2,num_key_value_heads=2,intermediate_size=64"
    model = load_model(model_type, tokenizer, config_overrides=overrides)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (32, 32)


def test_a_model_type_alone_runs_the_embedded_default_with_a_model_of_that_type(tmp_path):
    """`run_clm.py --model_type tied_llama --max_steps 2` trains the embedded default with a Llama of the package's
    small size (in Llama's fields, the default's context) instead of answering that nothing is to be done."""
    model_args, data_args, training_args = parse_arguments(CAUSAL_LM, ["--model_type", "tied_llama", "--max_steps", "2", "--output_dir", str(tmp_path)])
    assert training_args.do_train and training_args.do_eval and data_args.block_size == 64
    assert model_args.config_overrides == f"{small_size_overrides(TIED_MODELS['tied_llama'][0].config_class)},max_position_embeddings=64"
    model_args, _, _ = parse_arguments(CAUSAL_LM, ["--model_type", "tied_llama", "--config_overrides", "num_hidden_layers=2", "--output_dir", str(tmp_path)])
    assert model_args.config_overrides.endswith(",max_position_embeddings=64,num_hidden_layers=2")  # the user's keys win


def test_the_looped_flags_set_the_config_from_scratch_and_a_checkpoint_s_depth(tmp_path):
    """`--skipped_positions` chooses a run's depth on any model (`none`: all of a checkpoint saved with skips); the
    recipe flags build a new model's config; a checkpoint's recipe is its own."""
    model_args, _, _ = parse_arguments(
        CAUSAL_LM, ["--tying_strategy", "static:cycle:2", "--loop_residual_scale", "--loop_input_injection", "--skipped_positions", "4,5"]
    )
    assert model_args.looped_config == {"loop_residual_scale": True, "loop_input_injection": True, "skipped_positions": [4, 5]}
    tokenizer = load_tokenizer("shakespeare-bpe")
    model = load_model("tied_gpt2", tokenizer, config_overrides=model_args.config_overrides, looped_config=model_args.looped_config)
    assert (model.config.loop_residual_scale, model.config.loop_input_injection, model.config.skipped_positions) == (True, True, [4, 5])
    model.save_pretrained(tmp_path)
    for text, expected in (("none", None), ("3,4,5", [3, 4, 5])):
        looped_config = parse_arguments(CAUSAL_LM, ["--model_name_or_path", str(tmp_path), "--skipped_positions", text, "--output_dir", "o", "--do_eval"])[0].looped_config
        assert load_model("tied_gpt2", tokenizer, str(tmp_path), looped_config=looped_config).config.skipped_positions == expected
    with pytest.raises(ValueError, match=r"--skipped_positions\[0\] = 6 is not a position of this 6-block model"):
        load_model("tied_gpt2", tokenizer, str(tmp_path), looped_config={"skipped_positions": [6]})


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--skipped_positions", "4;5"], r"--skipped_positions '4;5': expected comma-separated block positions such as '4,5', or 'none'"),
        (["--model_name_or_path", ".", "--loop_residual_scale"], r"--loop_residual_scale only applies when training from scratch"),
    ],
)
def test_malformed_or_misplaced_looped_flags_are_named(flags, message):
    with pytest.raises(ValueError, match=message):
        parse_arguments(CAUSAL_LM, [*flags, "--output_dir", "o"])


TINY_LLAMA_FLAGS = "num_hidden_layers=4,hidden_size=16,num_attention_heads=2,intermediate_size=32,max_position_embeddings=32"


@pytest.mark.parametrize(
    "model_type, overrides, strategy, message",
    [
        ("tied_gpt2", TINY_GPT2, "static:cycle:2", r"--serving_output_dir .*: save_for_serving: the looped format is checked for .* this model is a tied_gpt2"),
        ("tied_llama", TINY_LLAMA_FLAGS, "static:sequence:2", r"--serving_output_dir .*: save_for_serving: the looped format runs U blocks n times"),
    ],
)
def test_serving_output_dir_refuses_what_cannot_be_served_before_training(tmp_path, text_files, model_type, overrides, strategy, message):
    flags = tiny_flags(tmp_path / "run", text_files, overrides, "--model_type", model_type, "--tying_strategy", strategy)
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, [*flags, "--serving_output_dir", str(tmp_path / "serving")])
    assert not (tmp_path / "run" / "checkpoint-2").exists() and not (tmp_path / "serving").exists()


def test_serving_output_dir_holds_the_trained_model_s_distinct_blocks_once(tmp_path, text_files):
    """Written after training; asked of a run that finished without it, written from its final model, training no
    step again."""
    flags = tiny_flags(tmp_path / "run", text_files, TINY_LLAMA_FLAGS, "--model_type", "tied_llama", "--tying_strategy", "static:cycle:2")
    run(CAUSAL_LM, flags)
    weights = (tmp_path / "run" / "model.safetensors").read_bytes()
    run(CAUSAL_LM, [*flags, "--serving_output_dir", str(tmp_path / "serving")])
    config = json.loads((tmp_path / "serving" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_loops"]) == (2, 2)
    assert (tmp_path / "serving" / "tokenizer.json").is_file()
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == weights  # nothing trained again


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--serving_output_dir", "{run}"], r"--serving_output_dir .* overlaps --output_dir"),
        (["--serving_output_dir", "{run}/serving"], r"--serving_output_dir .* overlaps --output_dir"),
        (["--tying_strategy", "similarity:2", "--loop_residual_scale", "--serving_output_dir", "{serving}"], r"computes with loop_residual_scale"),
        (["--tying_strategy", "static:cycle:2", "--lora_rank", "1", "--serving_output_dir", "{serving}"], r"lora_rank=1 relaxes the ties"),
    ],
)
def test_serving_output_dir_refusals_that_training_would_not_change_come_before_it(tmp_path, text_files, extra, message):
    folders = {"run": str(tmp_path / "run"), "serving": str(tmp_path / "serving")}
    extra = [argument.format(**folders) for argument in extra]
    strategy = [] if "--tying_strategy" in extra else ["--tying_strategy", "static:cycle:2"]
    flags = tiny_flags(tmp_path / "run", text_files, TINY_LLAMA_FLAGS, "--model_type", "tied_llama", *strategy, *extra)
    with pytest.raises(ValueError, match=message):
        run(CAUSAL_LM, flags)
    assert not (tmp_path / "run" / "model.safetensors").exists()
