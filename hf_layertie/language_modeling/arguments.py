"""Command-line arguments of `run_clm.py` / `run_mlm.py`, in the style of transformers' language-modeling examples."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser


@dataclass
class ModelArguments:
    """Which model and tokenizer to start from."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint (folder or Hub repo id) to fine-tune: a tied one, or a plain GPT-2 / BERT that the "
            "tying strategy then compresses. Leave unset to train from scratch."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "From scratch only: config fields, e.g. 'n_layer=6,n_embd=128,n_head=4'."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer folder or Hub repo id; 'embedded' picks the one shipped with hf-layertie (GPT-2 BPE for "
            "run_clm.py, bert-base-uncased for run_mlm.py). Defaults to model_name_or_path, else 'embedded'."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the model repo."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from the model repo to run."})

    def __post_init__(self):
        if self.config_overrides is not None and self.model_name_or_path is not None:
            raise ValueError("--config_overrides only applies when training from scratch, not with --model_name_or_path")


@dataclass
class DataTrainingArguments:
    """Which data to train and evaluate on. With no dataset and no files, the Shakespeare corpus shipped with
    hf-layertie is used (split by play: no text of an evaluation play is seen in training)."""

    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` name, e.g. 'wikitext'."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. 'wikitext-2-raw-v1'."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: a .txt, .json/.jsonl or .csv file."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    text_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the text (default: 'text', else the first column)."}
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

    def __post_init__(self):
        if self.validation_file is not None and self.train_file is None and self.dataset_name is None:
            raise ValueError("--validation_file needs --train_file (or --dataset_name)")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"--block_size must be >= 1, got {self.block_size}")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(f"--validation_split_percentage must be in (0, 100), got {self.validation_split_percentage}")


def parse_command_line(dataclass_types: tuple[type, ...], argv: list[str] | None = None, default_file: Path | None = None):
    """Parse flags, or a single .json / .yaml file of them, with `HfArgumentParser`.

    With no arguments at all, `default_file` (when given) is parsed instead: the scripts' embedded default run.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser(dataclass_types)
    if not argv and default_file is not None:
        print(f"No arguments: running the embedded default, {default_file}", file=sys.stderr)
        argv = [str(default_file)]
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=argv[0])
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(yaml_file=argv[0])
    return parser.parse_args_into_dataclasses(args=argv)
