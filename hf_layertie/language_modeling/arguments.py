"""Command-line arguments of `run_clm.py` / `run_mlm.py`, in the style of transformers' language-modeling examples."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from ..toolkit import check_tied_model_type

# Flags that name the user's own data or model: with any of them, the embedded default does not apply.
OWN_DATA_OR_MODEL_FLAGS = (
    "--dataset_name",
    "--dataset_config_name",
    "--train_file",
    "--validation_file",
    "--model_name_or_path",
    "--model_type",
)


@dataclass
class ModelArguments:
    """Which model and tokenizer to start from."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint (folder or Hub repo id) to fine-tune: a tied one, or a plain GPT-2 / BERT / Llama / "
            "Qwen2 / Mistral that the tying strategy then ties. Leave unset to train from scratch."
        },
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "help": "Tied model type: tied_gpt2, tied_llama, tied_qwen2, tied_mistral (run_clm.py), tied_bert (run_mlm.py). "
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

    def __post_init__(self):
        if self.config_overrides is not None and self.model_name_or_path is not None:
            raise ValueError("--config_overrides only applies when training from scratch, not with --model_name_or_path")
        if self.model_type is not None:
            check_tied_model_type(self.model_type)

    @property
    def hub_options(self) -> dict:
        return {"cache_dir": self.cache_dir, "revision": self.model_revision, "trust_remote_code": self.trust_remote_code}


@dataclass
class DataTrainingArguments:
    """Which data to train and evaluate on. With no dataset and no files, the Shakespeare corpus shipped with
    hf-layertie is used (split by play: no text of an evaluation play is seen in training)."""

    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` name, e.g. 'wikitext'."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. 'wikitext-2-raw-v1'."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: a .txt, .json/.jsonl or .csv file."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    text_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the text (default: 'text', else the first column, said in the log)."}
    )
    validation_split_percentage: int = field(
        default=5, metadata={"help": "Share of the train split used for evaluation when there is no validation split."}
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training example; at most the model's context (default: min(context, 1024))."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the training set (debugging)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the evaluation set."})
    mlm_probability: float = field(default=0.15, metadata={"help": "run_mlm.py: share of tokens masked."})
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks of .txt files."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    sample_max_new_tokens: int = field(
        default=60, metadata={"help": "Tokens of the sample printed after training (run_clm.py); 0 prints none."}
    )

    def __post_init__(self):
        if self.validation_file is not None and self.train_file is None and self.dataset_name is None:
            raise ValueError("--validation_file needs --train_file (or --dataset_name)")
        for name in ("block_size", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name} must be a positive integer, got {value!r}")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(f"--validation_split_percentage must be in (0, 100), got {self.validation_split_percentage}")
        if isinstance(self.sample_max_new_tokens, bool) or not isinstance(self.sample_max_new_tokens, int) or self.sample_max_new_tokens < 0:
            raise ValueError(f"--sample_max_new_tokens must be an integer >= 0, got {self.sample_max_new_tokens!r}")


def parse_command_line(
    dataclass_types: tuple[type, ...], argv: list[str] | None = None, default_file: Path | None = None, description: str | None = None
):
    """Parse flags, or a single .json / .yaml file of them, with `HfArgumentParser`.

    With `default_file` (the embedded default run) and no flag naming the user's own data or model
    (`OWN_DATA_OR_MODEL_FLAGS`), the default's values apply and every flag given overrides them;
    `--config_overrides` is applied after the default's own overrides.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser(dataclass_types, description=description)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=argv[0])
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(yaml_file=argv[0])
    if default_file is not None and not any(_names_flag(argument, flag) for argument in argv for flag in OWN_DATA_OR_MODEL_FLAGS):
        defaults = json.loads(Path(default_file).read_text())
        print(f"No data or model arguments: the embedded default ({default_file}) with the flags given on top", file=sys.stderr)
        parser.set_defaults(**defaults)
        argv = _after_default_overrides(argv, defaults.get("config_overrides"))
    return parser.parse_args_into_dataclasses(args=argv)


def _names_flag(argument: str, flag: str) -> bool:
    return argument == flag or argument.startswith(flag + "=")


def _after_default_overrides(argv: list[str], default_overrides: str | None) -> list[str]:
    """`argv` with a `--config_overrides` value prefixed by the default's, so the user's keys win."""
    if default_overrides is None:
        return argv
    merged = list(argv)
    for index, argument in enumerate(merged):
        if argument == "--config_overrides" and index + 1 < len(merged):
            merged[index + 1] = f"{default_overrides},{merged[index + 1]}"
        elif argument.startswith("--config_overrides="):
            merged[index] = f"--config_overrides={default_overrides},{argument.split('=', 1)[1]}"
    return merged
