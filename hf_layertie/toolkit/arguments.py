"""Command-line arguments every script shares: which model to start from, and one parser for flags or a file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from ..models import TIED_MODELS
from ..models.configuration_tying import LOOP_RECIPE_FIELDS
from ..trainer.training_args import TyingTrainingArguments
from .models import (
    ATTN_IMPLEMENTATIONS,
    TORCH_DTYPES,
    check_loading_options,
    check_model_source,
    check_tied_model_type,
    small_size_overrides,
)

# Settings that name the user's own data or model: with any of them given, the embedded default does not apply. A
# `--model_type` alone keeps the default, with a model of that type of the default's size (`_for_model_type`).
OWN_DATA_OR_MODEL_SETTINGS = (
    "dataset_name",
    "dataset_config_name",
    "train_file",
    "validation_file",
    "model_name_or_path",
)


@dataclass
class ModelArguments:
    """Which model and tokenizer to start from."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint (folder or Hub repo id) to fine-tune: a tied one, or a plain one of a type with a tied "
            f"class ({', '.join(name.removeprefix('tied_') for name in TIED_MODELS)}) that the tying strategy then "
            "ties. Leave unset to train from scratch."
        },
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "help": f"Tied model type: {', '.join(TIED_MODELS)} (run_clm.py and run_lambada.py take the causal ones). "
            "Default: the checkpoint's own type, tied; from scratch, tied_gpt2 / tied_bert."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "From scratch only: config fields, e.g. 'n_layer=6,n_embd=128,n_head=4'. On top of the embedded "
            "default they are applied after its own."
        },
    )
    skipped_positions: str | None = field(
        default=None,
        metadata={
            "help": "Looped models: block positions this run leaves out (the identity), comma-separated, in training "
            "and evaluation: '4,5' runs a cycle:2 model of 6 positions at 2 loops instead of 3. 'none' computes every "
            "position of a checkpoint saved with some skipped. Default: the config's (from scratch: none)."
        },
    )
    loop_residual_scale: bool = field(
        default=False,
        metadata={
            "help": "From scratch only (a checkpoint keeps its own): scale each block's update by 1/N, N the positions "
            "computing its weights (config.loop_residual_scale; arXiv 2606.18524)."
        },
    )
    loop_input_injection: bool = field(
        default=False,
        metadata={
            "help": "From scratch only (a checkpoint keeps its own): add the token embeddings to the input of every "
            "repeated position, as Huginn and Ouro do (config.loop_input_injection)."
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer folder, Hub repo id, or a shipped one: shakespeare-bpe (run_clm.py's default), "
            "shakespeare-wordpiece (run_mlm.py's default), gpt2, bert-base-uncased. Defaults to model_name_or_path."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model repo."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model repo to run."})
    torch_dtype: str | None = field(
        default=None,
        metadata={
            "help": f"Override the default `torch.dtype` and load the model under this dtype: {', '.join(TORCH_DTYPES)}. "
            "'auto' takes a checkpoint's own dtype; from scratch, the config's (float32)."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": f"The attention implementation: {', '.join(ATTN_IMPLEMENTATIONS)} (flash_attention_2 needs the "
            "flash-attn package and a GPU it supports). Default: transformers' own, sdpa."
        },
    )

    def __post_init__(self):
        if self.config_overrides is not None and self.model_name_or_path is not None:
            raise ValueError("--config_overrides only applies when training from scratch, not with --model_name_or_path")
        recipe = [f"--{name}" for name in LOOP_RECIPE_FIELDS if getattr(self, name)]
        if recipe and self.model_name_or_path is not None:
            raise ValueError(
                f"{', '.join(recipe)} only applies when training from scratch: the checkpoint of --model_name_or_path "
                f"computes with the loop recipe in its config.json, which it was trained with"
            )
        self.looped_config  # noqa: B018 (refuses a malformed --skipped_positions before anything loads)
        if self.model_type is not None:
            check_tied_model_type(self.model_type)
        for flag in ("model_name_or_path", "tokenizer_name"):
            if getattr(self, flag) is not None:
                check_model_source(f"--{flag}", getattr(self, flag))
        check_loading_options(self.torch_dtype, self.attn_implementation)

    @property
    def looped_config(self) -> dict:
        """The tied config fields these flags set (`load_model`'s `looped_config`): the loop recipe's switched on, and
        `skipped_positions` as a list (`[]`: every position computes)."""
        fields = {name: True for name in LOOP_RECIPE_FIELDS if getattr(self, name)}
        if self.skipped_positions is not None:
            fields["skipped_positions"] = parse_positions("--skipped_positions", self.skipped_positions)
        return fields

    @property
    def hub_options(self) -> dict:
        return {"cache_dir": self.cache_dir, "revision": self.model_revision, "trust_remote_code": self.trust_remote_code}

    @property
    def loading_options(self) -> dict:
        """How `load_model` builds the model (not for the tokenizer or the config, unlike `hub_options`)."""
        return {"torch_dtype": self.torch_dtype, "attn_implementation": self.attn_implementation}


def parse_positions(flag: str, text: str) -> list[int]:
    """`"4,5"` as a list of positions; `"none"` (or nothing) as the empty list. The model checks their range."""
    if text.strip().lower() in ("", "none"):
        return []
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated block positions such as '4,5', or 'none'") from None


def changed_from_default(arguments, names) -> list[str]:
    """The flags among `names` that `arguments` (a dataclass of them) holds away from their defaults: set by the user,
    as far as can be told after parsing."""
    defaults = {field.name: field.default for field in dataclasses.fields(arguments)}
    return [f"--{name}" for name in names if getattr(arguments, name) != defaults[name]]


def refuse_training_settings_without_training(training_args) -> None:
    """Refuse tying or distillation settings on a run that does not train (`TyingTrainingArguments
    .training_settings_given`): it scores the model with its saved map and no teacher, so they would be dropped."""
    given = [f"--{name}" for name in training_args.training_settings_given()]
    if given and not training_args.do_train:
        raise ValueError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} read only in training, and this run does not pass "
            "--do_train: evaluation scores the model of --model_name_or_path with the tying map it was saved with (and "
            f"no teacher). Leave {'it' if len(given) == 1 else 'them'} unset, or pass --do_train"
        )


def check_training_sources(training_args) -> None:
    """Refuse a `--distill_from` that is neither a folder nor a Hub repo id before any data or model is loaded (the
    teacher is loaded only with the trainer, and transformers would call a missing folder a malformed repo id)."""
    if training_args.distill_from is not None:
        check_model_source("--distill_from", training_args.distill_from)


def parse_command_line(
    dataclass_types: tuple[type, ...], argv: list[str] | None = None, default_file: Path | None = None, description: str | None = None
):
    """Parse flags, or a single .json / .yaml file of them, with `HfArgumentParser`.

    With `default_file` (the embedded default run) and no flag (or key of the file) naming the user's own data or model
    (`OWN_DATA_OR_MODEL_SETTINGS`, under any spelling argparse accepts: `--dataset_name`, `--dataset-name`, an
    unambiguous prefix), the default's values apply and every flag given overrides them; `--config_overrides` is
    applied after the default's own overrides. The default's tying settings that the chosen strategy does not read
    drop out (`--tying_strategy static:all` on a default that sets the `dlt` interval): the user did not set them,
    while one the user sets is refused by `TyingTrainingArguments`.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser(dataclass_types, description=description)
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
        return _parse_settings_file(parser, Path(argv[0]), default_file)
    if default_file is None:
        return parser.parse_args_into_dataclasses(args=argv)
    defaults = json.loads(Path(default_file).read_text())
    given = _given(dataclass_types, argv, (*OWN_DATA_OR_MODEL_SETTINGS, "model_type", *defaults))
    if any(name in given for name in OWN_DATA_OR_MODEL_SETTINGS):
        return parser.parse_args_into_dataclasses(args=argv)
    defaults = _for_model_type(defaults, given)
    parser.set_defaults(**_default_beneath(default_file, defaults, given))
    return _with_both_config_overrides(parser.parse_args_into_dataclasses(args=argv), defaults, given)


def _parse_settings_file(parser: HfArgumentParser, path: Path, default_file: Path | None):
    """A .json / .yaml file of settings, read as the same flags would be: on top of the embedded default unless it
    names the user's own data or model."""
    text = path.read_text(encoding="utf-8")
    given = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if default_file is None or any(name in given for name in OWN_DATA_OR_MODEL_SETTINGS):
        return parser.parse_dict(given)
    defaults = _for_model_type(json.loads(Path(default_file).read_text()), given)
    parsed = parser.parse_dict({**_default_beneath(default_file, defaults, given), **given})
    return _with_both_config_overrides(parsed, defaults, given)


def _default_beneath(default_file: Path, defaults: dict, given: dict) -> dict:
    """The embedded default's settings that the settings `given` build on (its tying settings that their strategy
    does not read dropped)."""
    print(f"No data or model arguments: the embedded default ({default_file}) with the settings given on top", file=sys.stderr)
    return {**defaults, **dict.fromkeys(_unread_default_settings(defaults, given))}


def _for_model_type(defaults: dict, given: dict) -> dict:
    """The default's settings for the `--model_type` given: its own `config_overrides` name its own type's fields
    (GPT-2's `n_layer`, ...), so another type gets the package's small size (`small_size_overrides`) in its own
    fields, with the default's context (`block_size`)."""
    chosen = given.get("model_type")
    if chosen is None or chosen == defaults["model_type"]:
        return defaults
    check_tied_model_type(chosen)
    config_class = TIED_MODELS[chosen][0].config_class
    context = config_class.attribute_map.get("max_position_embeddings", "max_position_embeddings")
    overrides = f"{small_size_overrides(config_class)},{context}={defaults['block_size']}"
    print(f"--model_type {chosen}: the embedded default's {defaults['model_type']} ({defaults['config_overrides']}) becomes a {chosen} of {overrides}", file=sys.stderr)
    return {**defaults, "config_overrides": overrides}


def _with_both_config_overrides(parsed: tuple, defaults: dict, given: dict) -> tuple:
    """`--config_overrides` given on top of the default's own applies after them (the user's keys win)."""
    if given.get("config_overrides") and defaults.get("config_overrides"):
        model_arguments = next(arguments for arguments in parsed if isinstance(arguments, ModelArguments))
        model_arguments.config_overrides = f"{defaults['config_overrides']},{given['config_overrides']}"
    return parsed


def _given(dataclass_types: tuple[type, ...], argv: list[str], names: tuple[str, ...]) -> dict:
    """The values `argv` gives to the settings `names`, under any spelling of their flags.

    argparse only fills the defaults of the names a namespace lacks, so a namespace holding a marker for every name
    tells the values given in `argv` from the rest. The probe has no `--help` of its own: `--help` is the full
    parser's, which shows the embedded default's values.
    """
    marker = object()
    probe = HfArgumentParser(dataclass_types, add_help=False)
    namespace, _ = probe.parse_known_args(argv, namespace=argparse.Namespace(**dict.fromkeys(names, marker)))
    return {name: getattr(namespace, name) for name in names if getattr(namespace, name, marker) is not marker}


def _unread_default_settings(defaults: dict, given: dict) -> list[str]:
    """The tying settings of `defaults` that the flags `given` do not set and their tying strategy does not read."""
    strategy = given.get("tying_strategy", defaults.get("tying_strategy"))
    unread = TyingTrainingArguments.settings_unread_by(strategy)
    return [name for name in unread if name in defaults and name not in given]
