"""Model cards: valid Hub metadata, and text that states the actual model's map, size and results."""

import re

import pytest
import torch
from helpers.models import EVERY_KIND, make_tiny_gpt2_config, raw_tying_maps
from huggingface_hub import ModelCard
from hypothesis import given, settings
from transformers import GPT2LMHeadModel, TrainingArguments

from hf_layertie import TyingTrainingArguments
from hf_layertie.model_card import TAGS, build_model_card, write_model_card

KINDS = {kind.name: kind for kind in EVERY_KIND}
PIPELINE_TAGS = {"AutoModelForCausalLM": "text-generation", "AutoModelForMaskedLM": "fill-mask"}


def make_model(kind: str, tying_map=None, num_blocks=None):
    return KINDS[kind].tied_class(KINDS[kind].make_config(tying_map, num_blocks=num_blocks)).eval()


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("kind", sorted(KINDS))
@settings(max_examples=15, deadline=None)
@given(tying_map=raw_tying_maps(min_blocks=2, max_blocks=6))
def test_card_states_the_map_distinct_blocks_and_parameter_counts_of_the_model(kind, tying_map, tmp_path_factory):
    model = make_model(kind, tying_map)
    untied = make_model(kind, num_blocks=len(tying_map))
    path = write_model_card(model, tmp_path_factory.mktemp("card"), model_name="org/tiny")

    card = ModelCard.load(path)
    counts = model.parameter_counts()
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == PIPELINE_TAGS[KINDS[kind].auto_class.__name__]
    assert set(TAGS) | {f"tied_{kind}", kind} <= set(card.data.tags)
    assert f"`{model.tying_map.render()}`" in card.text
    assert f"{model.tying_map.num_distinct} distinct blocks out of {len(tying_map)}" in card.text
    untied_here = model.tying_map.num_distinct == len(tying_map)
    assert ("each with weights of its own" in card.text) == untied_here
    assert ("the others reuse the weights of an earlier block" in card.text) == (not untied_here)
    for source, blocks in model.tying_map.groups().items():
        assert f"| {source} | {', '.join(map(str, blocks))} |" in card.text
    assert f"| Total | {counts.total:,} |" in card.text
    assert f"| Trainable | {counts.trainable:,} |" in card.text
    assert f"| Same architecture without tying | {untied.parameter_counts().total:,} |" in card.text


@pytest.mark.parametrize("skipped", [None, [2, 3]])
def test_the_card_says_which_positions_the_model_skips(skipped, tmp_path):
    model = make_model("llama", [0, 1, 1, 1])
    model.config.skipped_positions = skipped
    card = ModelCard.load(write_model_card(model, tmp_path, model_name="org/tiny")).text
    said = "Positions 2, 3 are skipped (`config.skipped_positions`):\nthe model computes the other 2 positions"
    assert (said in card) == (skipped is not None), card


def test_metadata_has_base_model_datasets_and_eval_results_in_the_model_index(tmp_path):
    eval_results = {"eval_loss": 3.25, "perplexity": 25.79, "eval_runtime": 1.5, "eval_samples_per_second": 80.0}
    path = write_model_card(
        make_model("gpt2", [0, 0, 2, 0]),
        tmp_path,
        eval_results=eval_results,
        dataset_names=["Salesforce/wikitext"],
        base_model="openai-community/gpt2",
        model_name="org/tiny-tied",
    )

    data = ModelCard.load(path).data
    assert data.base_model == "openai-community/gpt2"
    assert data.datasets == ["Salesforce/wikitext"]
    assert data.model_name == "org/tiny-tied"
    assert {(result.dataset_type, result.metric_name, result.metric_value) for result in data.eval_results} == {
        ("Salesforce/wikitext", "eval_loss", 3.25),
        ("Salesforce/wikitext", "perplexity", 25.79),
    }
    assert data.metrics == ["loss", "perplexity"]


def test_metadata_names_only_hub_datasets_and_the_text_names_every_dataset(tmp_path):
    names = ["Salesforce/wikitext", "train.txt (local file)", "hop_induction (length=64,max_hops=4)", str(tmp_path)]
    card = build_model_card(make_model("gpt2"), eval_results={"eval_loss": 2.5}, dataset_names=names[1:] + names[:1])

    assert card.data.datasets == ["Salesforce/wikitext"]
    assert card.data.eval_results is None  # attributed to the first name, a local file: no Hub id to give
    assert "| train.txt (local file) | eval_loss | 2.5 |" in card.text
    for name in names:
        assert name in card.text


def test_eval_results_per_dataset_appear_in_the_table_and_runtime_keys_do_not(tmp_path):
    # `Trainer.evaluate()` before any training adds eval_model_preparation_time: a timing, not a metric.
    wikitext = {"eval_loss": 3.5, "epoch": 2.0, "eval_model_preparation_time": 0.0021}
    eval_results = {"lambada": {"accuracy": 0.3125, "perplexity": 41.5}, "wikitext": wikitext}
    card = ModelCard.load(write_model_card(make_model("gpt2", [0, 0, 0, 3]), tmp_path, eval_results=eval_results))

    assert "| lambada | accuracy | 0.3125 |" in card.text
    assert "| lambada | perplexity | 41.5 |" in card.text
    assert "| wikitext | eval_loss | 3.5 |" in card.text
    assert "epoch" not in card.text and "preparation_time" not in card.text
    assert len(card.data.eval_results) == 3


def test_a_card_without_base_model_eval_results_or_training_arguments_says_so(tmp_path):
    card = ModelCard.load(write_model_card(make_model("bert", [0, 1, 1]), tmp_path))

    assert set(card.data.to_dict()) == {"library_name", "pipeline_tag", "tags"}
    assert "trained from scratch" in card.text
    assert "## Evaluation results" not in card.text
    assert "## Training hyper-parameters" not in card.text


def test_an_evaluation_only_card_names_no_training_and_a_local_base_model_only_in_its_text(tmp_path):
    base = tmp_path / "checkpoint"
    base.mkdir()
    card = ModelCard.load(
        write_model_card(
            make_model("gpt2", [0, 0, 2, 2]),
            tmp_path / "card",
            eval_results={"lambada": {"lambada_accuracy": 0.25, "lambada_examples": 5153}},
            dataset_names=["lambada"],
            base_model=str(base),
            evaluated_only=True,
        )
    )
    assert "This card records no training: the results below were measured with hf-layertie on lambada." in card.text
    for claim in ("fine-tuned", "trained from scratch", "trained conventionally", "## Training hyper-parameters"):
        assert claim not in card.text
    assert card.data.base_model is None and card.data.datasets is None and str(base) not in str(card.data.to_dict())
    hub_base = ModelCard.load(
        write_model_card(make_model("gpt2", [0, 0, 2, 2]), tmp_path / "hub", base_model="openai-community/gpt2", evaluated_only=True)
    )
    assert hub_base.data.base_model is None  # nothing was fine-tuned from it here
    assert [result.metric_name for result in card.data.eval_results] == ["lambada_accuracy"]  # not the count scored
    trained = ModelCard.load(write_model_card(make_model("gpt2", [0, 0, 2, 2]), tmp_path / "trained", base_model=str(base)))
    assert f"It was fine-tuned from a local checkpoint (`{base}`)" in trained.text and trained.data.base_model is None


def test_the_untied_count_of_relaxed_ties_is_the_exported_model_s():
    from hf_layertie.relaxed_ties import relax_ties

    model = make_model("gpt2", [0, 0, 2, 2])
    relax_ties(model, 2, "zero")
    card = build_model_card(model)
    exported = sum(parameter.numel() for parameter in model.to_untied().parameters())
    assert f"| Same architecture without tying | {exported:,} |" in card.text


def test_training_arguments_list_the_hyperparameters_and_every_tying_setting_given(tmp_path):
    arguments = TyingTrainingArguments(
        output_dir=str(tmp_path / "run"), learning_rate=3e-4, per_device_train_batch_size=4, max_steps=120, seed=7,
        dlt_variant="paper", q_gamma=0.9, epsilon_decay=0.9, reward_block_cost=0.01, max_distinct_blocks=3,
    )  # fmt: skip
    card = build_model_card(make_model("gpt2", [0, 0, 2, 2]), training_args=arguments)

    for line in (
        "- learning_rate: 0.0003",
        "- per_device_train_batch_size: 4",
        "- max_steps: 120",
        "- seed: 7",
        "- tying_strategy: dlt",
        "- dlt_variant: paper",
        "- tying_interval: 15",
        "- max_distinct_blocks: 3",
        "- q_gamma: 0.9",
        "- epsilon_decay: 0.9",
        "- reward_block_cost: 0.01",
    ):
        assert line in card.text
    assert "num_train_epochs" not in card.text
    assert "q_forgetting" not in card.text  # left at None: the variant's value, nothing to report


@pytest.mark.parametrize(
    "strategy, says",
    [
        ("dlt", "learned during training by Dynamic Layer Tying"),
        ("random", "random tying decisions"),
        ("static:cycle:2", "fixed for the whole run (`static:cycle:2`)"),
        ("similarity:2", "grouping blocks that transform their input most similarly (`similarity:2`)"),
        (None, "set when the model was built or converted"),
    ],
)
def test_the_method_says_how_the_map_was_chosen_and_not_by_an_agent_where_none_ran(strategy, says, tmp_path):
    arguments = TyingTrainingArguments(output_dir=str(tmp_path), tying_strategy=strategy, report_to=[]) if strategy else None
    method = build_model_card(make_model("gpt2", [0, 0, 2, 2]), training_args=arguments).text.split("## Method")[1]
    method = " ".join(method.split("## Tying map")[0].split())
    assert says in method
    assert ("agent" in method) == (strategy == "dlt")


def test_epochs_are_listed_when_training_is_not_bounded_by_steps(tmp_path):
    arguments = TrainingArguments(output_dir=str(tmp_path / "run"), num_train_epochs=2.0)
    card = build_model_card(make_model("gpt2"), training_args=arguments)

    assert "- num_train_epochs: 2.0" in card.text
    assert "max_steps" not in card.text


def test_citations_cover_the_method_and_the_named_datasets():
    datasets = ["wikitext-2", "EleutherAI/lambada_openai", "shakespeare"]
    card = build_model_card(make_model("gpt2"), dataset_names=datasets)

    assert "Dynamic Layer Tying for Parameter-Efficient Transformers" in card.text
    assert "2401.12819" in card.text
    assert "Pointer Sentinel Mixture Models" in card.text
    assert "The {LAMBADA} dataset" in card.text
    assert "public domain texts from Project Gutenberg" in card.text
    assert "Pointer Sentinel" not in str(build_model_card(make_model("gpt2"), dataset_names=["lambada"]))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_loading_code_in_the_card_loads_the_checkpoint_with_and_without_the_package_and_exports_it(
    kind, tmp_path, monkeypatch
):
    model = make_model(kind, [0, 0, 2, 0])
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    card = build_model_card(model, model_name=str(checkpoint))
    with_package, without_package, export = code_blocks(card.text, "python")
    input_ids = torch.tensor([[5, 17, 42, 8, 99, 3]])

    assert "import hf_layertie" in with_package and "trust_remote_code=True" not in with_package
    assert "import hf_layertie" not in without_package and "trust_remote_code=True" in without_package
    for snippet in (with_package, without_package):
        namespace = {}
        exec(snippet.replace("print(model.tying_map)", ""), namespace)
        loaded = namespace["model"].eval()
        assert type(loaded).__name__ == type(model).__name__
        assert KINDS[kind].auto_class.__name__ in snippet
        with torch.no_grad():
            torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits, rtol=0, atol=0)
    # The export line, run on the model the first snippet loaded, writes a plain checkpoint of the class it names.
    plain_class = KINDS[kind].plain_class
    assert f"As a plain `{plain_class.__name__}`" in card.text
    monkeypatch.chdir(tmp_path)
    exec(export, {"model": namespace["model"]})
    exported = plain_class.from_pretrained(tmp_path / "checkpoint-untied").eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids).logits, model(input_ids).logits, rtol=0, atol=0)


def test_the_tying_plot_is_linked_relative_to_the_card_and_copied_beside_it(tmp_path):
    plot = tmp_path / "logs" / "tying_map.png"
    plot.parent.mkdir()
    plot.write_bytes(b"\x89PNG not really")
    output_dir = tmp_path / "model"

    card = ModelCard.load(write_model_card(make_model("gpt2"), output_dir, tying_plot=plot))

    assert "](tying_map.png)" in card.text
    assert (output_dir / "tying_map.png").read_bytes() == plot.read_bytes()
    with pytest.raises(FileNotFoundError, match="missing.png"):
        write_model_card(make_model("gpt2"), tmp_path / "other", tying_plot=tmp_path / "missing.png")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eval_results": {"accuracy": "high"}}, r"eval_results\['accuracy'\] = 'high' is not a number"),
        ({"eval_results": {"lambada": {"accuracy": None}}}, r"eval_results\['lambada'\]\['accuracy'\] = None"),
        ({"eval_results": [0.5]}, "eval_results must be a dict"),
        ({"dataset_names": "wikitext"}, "dataset_names must be a list"),
    ],
)
def test_bad_arguments_are_named_in_the_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_model_card(make_model("gpt2"), **kwargs)


def test_a_model_without_an_auto_class_is_refused_with_the_reason():
    plain = GPT2LMHeadModel(make_tiny_gpt2_config())

    with pytest.raises(ValueError, match="registered for one of"):
        build_model_card(plain)
