"""Model cards for tied checkpoints: what is tied, what it saves, how it scored, how to load it.

Cards are rendered by huggingface_hub's `ModelCard.from_template` from one Jinja template,
`hf_layertie/templates/tied_model_card_template.md`, shipped with the package (the only copy;
`model_cards/README.md` documents it and shows a rendered example). The YAML metadata comes from
`ModelCardData`, so the Hub indexes the library, tags, datasets, base model and evaluation results.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.constants import REPOCARD_NAME
from huggingface_hub.utils import HFValidationError, validate_repo_id

TEMPLATE_PATH = Path(__file__).parent / "templates" / "tied_model_card_template.md"
TAGS = ("hf-layertie", "dynamic-layer-tying", "weight-sharing")

# The Auto class a model is registered for (`register_for_auto_class`) -> (pipeline tag, task name on the Hub).
_TASKS = {
    "AutoModelForCausalLM": ("text-generation", "Causal Language Modeling"),
    "AutoModelForMaskedLM": ("fill-mask", "Masked Language Modeling"),
}
# Keys `Trainer.evaluate()` and the scripts add next to the metrics (timings, counts of what was scored);
# transformers' own cards leave them out too.
_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "epoch", "step", "_samples", "_examples", "_preparation_time")


@dataclass(frozen=True)
class DatasetReference:
    """How to credit a dataset, recognised by `keyword` in a dataset name (`"wikitext"` in `"Salesforce/wikitext"`)."""

    keyword: str
    name: str
    note: str
    bibtex: str | None = None


DATASET_REFERENCES = (
    DatasetReference(
        "wikitext",
        "WikiText",
        "Merity et al. (2016), CC BY-SA.",
        "@article{merity2016pointer,\n"
        "  title   = {Pointer Sentinel Mixture Models},\n"
        "  author  = {Merity, Stephen and Xiong, Caiming and Bradbury, James and Socher, Richard},\n"
        "  journal = {arXiv preprint arXiv:1609.07843},\n"
        "  year    = {2016}\n"
        "}",
    ),
    DatasetReference(
        "lambada",
        "LAMBADA",
        "Paperno et al. (2016), CC BY 4.0.",
        "@inproceedings{paperno2016lambada,\n"
        "  title     = {The {LAMBADA} dataset: Word prediction requiring a broad discourse context},\n"
        "  author    = {Paperno, Denis and Kruszewski, Germ{\\'a}n and Lazaridou, Angeliki and Pham, Quan Ngoc and\n"
        "               Bernardi, Raffaella and Pezzelle, Sandro and Baroni, Marco and Boleda, Gemma and\n"
        "               Fern{\\'a}ndez, Raquel},\n"
        "  booktitle = {Proceedings of the 54th Annual Meeting of the Association for Computational Linguistics},\n"
        "  pages     = {1525--1534},\n"
        "  year      = {2016}\n"
        "}",
    ),
    DatasetReference(
        "shakespeare",
        "Shakespeare",
        "the plays of William Shakespeare, public domain texts from Project Gutenberg.",
    ),
)


@dataclass(frozen=True)
class _EvalRow:
    dataset: str | None
    metric: str
    value: int | float


def build_model_card(
    model,
    *,
    training_args=None,
    eval_results: Mapping[str, Any] | None = None,
    dataset_names: Sequence[str] | None = None,
    base_model: str | None = None,
    tying_plot: str | Path | None = None,
    model_name: str | None = None,
    evaluated_only: bool = False,
) -> ModelCard:
    """The model card of a tied model (a `TiedBlocksMixin` model registered for an Auto class).

    Args:
        model: the trained model; its map, distinct blocks and parameter counts go into the card.
        training_args: `TrainingArguments` (or any object with its attributes): learning rate, batch sizes,
            steps or epochs, seed, and the tying settings it names in `tying_fields()` (`TyingTrainingArguments`).
        eval_results: `{metric: value}` as returned by `Trainer.evaluate()` (attributed to the first of
            `dataset_names`), or `{dataset: {metric: value}}`. Runtime and throughput keys are left out.
        dataset_names: datasets the model was trained on (Hub ids or names); WikiText, LAMBADA and
            Shakespeare are credited. The text names them all; the metadata (`datasets:`, `model-index`), which
            the Hub reads as dataset ids, takes only those that could be one: no local path, no name with spaces
            such as `"train.txt (local file)"`.
        base_model: the Hub id (or local folder, named in the text only) the model was fine-tuned from; `None`
            for a model trained from scratch.
        tying_plot: the plot of the map over training; the card links its file name, relative to the card.
        model_name: the Hub repo id (or a name): title, model-index name and the id in the loading code.
            Defaults to the last part of `model.name_or_path`.
        evaluated_only: the run scored the model and trained nothing: the card says so and names no training
            (pass no `training_args`).
    """
    auto_class, (pipeline_tag, task_name) = _task(model)
    model_id = model_name or Path(model.name_or_path).name or f"{model.config.model_type}-model"
    dataset_names = _check_dataset_names(dataset_names)
    eval_rows = _eval_rows(eval_results, default_dataset=dataset_names[0] if dataset_names else None)
    model_index = _eval_results(eval_rows, pipeline_tag, task_name)
    tying_map = model.tying_map
    untied_class = model.untied_class()
    hub_base_model = _hub_id(base_model)
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=[*TAGS, model.config.model_type, untied_class.config_class.model_type],
        # The Hub reads these two as what the model was fine-tuned from and trained on: none without training.
        base_model=None if evaluated_only else hub_base_model,
        datasets=None if evaluated_only else [name for name in dataset_names if _hub_id(name)] or None,
        metrics=list(dict.fromkeys(_metric_type(row.metric) for row in eval_rows)) or None,
        model_name=model_id if model_index else None,
        eval_results=model_index or None,
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE_PATH),
        model_id=model_id,
        architecture=type(model).__name__,
        untied_architecture=untied_class.__name__,
        auto_class=auto_class,
        base_model=hub_base_model,
        base_model_path=base_model if hub_base_model is None else None,
        evaluated_only=evaluated_only,
        dataset_names=dataset_names,
        num_blocks=len(tying_map),
        num_distinct=tying_map.num_distinct,
        tying_map=tying_map.render(),
        skipped_positions=model.config.skipped_positions,
        tying_groups=list(tying_map.groups().items()),
        parameters=model.parameter_counts(),
        untied_parameters=model.untied_parameter_count(),
        eval_rows=eval_rows,
        hyperparameters=_hyperparameters(training_args),
        tying_strategy=getattr(training_args, "tying_strategy", None),
        tying_plot=Path(tying_plot).name if tying_plot is not None else None,
        dataset_references=_dataset_references(dataset_names),
    )


def write_model_card(model, output_dir: str | Path, **kwargs) -> Path:
    """Save the card of `model` as `output_dir/README.md` (and copy the tying plot beside it); return its path.

    Takes the keyword arguments of `build_model_card`.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tying_plot = kwargs.get("tying_plot")
    if tying_plot is not None:
        _place_beside_card(Path(tying_plot), output_dir)
    path = output_dir / REPOCARD_NAME
    build_model_card(model, **kwargs).save(path)
    return path


def _task(model) -> tuple[str, tuple[str, str]]:
    auto_class = getattr(type(model), "_auto_class", None)
    if auto_class not in _TASKS:
        raise ValueError(
            f"build_model_card needs a model registered for one of {sorted(_TASKS)} (import hf_layertie "
            f"registers the tied models); {type(model).__name__} is registered for {auto_class!r}"
        )
    return auto_class, _TASKS[auto_class]


def _check_dataset_names(dataset_names: Sequence[str] | None) -> list[str]:
    if dataset_names is None:
        return []
    if isinstance(dataset_names, str) or not all(isinstance(name, str) for name in dataset_names):
        raise ValueError(f"dataset_names must be a list of dataset names, got {dataset_names!r}")
    return list(dataset_names)


def _eval_rows(eval_results: Mapping[str, Any] | None, default_dataset: str | None) -> list[_EvalRow]:
    if eval_results is None:
        return []
    if not isinstance(eval_results, Mapping):
        raise ValueError(f"eval_results must be a dict of metrics, got {type(eval_results).__name__}")
    rows = []
    for key, value in eval_results.items():
        if isinstance(value, Mapping):
            rows += [_eval_row(key, metric, metric_value) for metric, metric_value in value.items()]
        else:
            rows.append(_eval_row(default_dataset, key, value))
    return [row for row in rows if not row.metric.endswith(_NOT_METRICS)]


def _eval_row(dataset: str | None, metric: str, value) -> _EvalRow:
    if isinstance(value, bool) or not isinstance(value, Real):
        where = f"eval_results[{dataset!r}][{metric!r}]" if dataset else f"eval_results[{metric!r}]"
        raise ValueError(f"{where} = {value!r} is not a number")
    return _EvalRow(dataset, metric, int(value) if isinstance(value, Integral) else float(value))


def _metric_type(metric: str) -> str:
    return metric.removeprefix("eval_").removeprefix("test_")


def _eval_results(rows: list[_EvalRow], task_type: str, task_name: str) -> list[EvalResult]:
    """The rows that name a Hub dataset, as Hub `model-index` entries (which require its id)."""
    return [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=row.dataset,
            dataset_name=row.dataset,
            metric_type=_metric_type(row.metric),
            metric_name=row.metric,
            metric_value=row.value,
        )
        for row in rows
        if _hub_id(row.dataset)
    ]


def _hyperparameters(training_args) -> dict[str, str]:
    if training_args is None:
        return {}
    max_steps = getattr(training_args, "max_steps", None)
    length = "max_steps" if max_steps is not None and max_steps > 0 else "num_train_epochs"
    names = [
        "learning_rate",
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        length,
        "seed",
        *(training_args.tying_fields() if hasattr(training_args, "tying_fields") else []),
    ]
    # Settings left at None take their variant's value (see `AgentConfig`): listing "None" would say nothing.
    return {
        name: _format_value(getattr(training_args, name))
        for name in names
        if getattr(training_args, name, None) is not None
    }


def _format_value(value) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def _hub_id(name: str | None) -> str | None:
    """`name` when it could name a Hub repo (what the card's metadata and link take), None for a local path or a
    description."""
    if name is None or Path(name).exists():
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def _dataset_references(dataset_names: list[str]) -> list[DatasetReference]:
    return [
        reference
        for reference in DATASET_REFERENCES
        if any(reference.keyword in name.lower() for name in dataset_names)
    ]


def _place_beside_card(plot: Path, output_dir: Path) -> None:
    if not plot.is_file():
        raise FileNotFoundError(f"tying_plot={str(plot)!r} does not exist; the card would link a missing image")
    destination = output_dir / plot.name
    if not destination.exists() or not destination.samefile(plot):
        shutil.copyfile(plot, destination)
