"""Data arguments of `run_clm.py` / `run_mlm.py`, in the style of transformers' language-modeling examples (the
model arguments and the parser every script shares are `hf_layertie.toolkit.arguments`')."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..toolkit import changed_from_default
from .generated_tasks import HOP_TASKS, check_removed_task, hop_task_config

DEFAULT_MLM_PROBABILITY = 0.15
# Data arguments of text that a generated task has no use for: its examples, and their length, come from
# `--dataset_config_name`.
TEXT_ONLY_ARGUMENTS = (
    "train_file", "validation_file", "block_size", "text_column_name", "preprocessing_num_workers",
    "validation_split_percentage", "keep_linebreaks",
)  # fmt: skip


@dataclass
class DataTrainingArguments:
    """Which data to train and evaluate on. With no dataset and no files, the Shakespeare corpus shipped with
    hf-layertie is used (split by play: no text of an evaluation play is seen in training)."""

    # Settings that change what is trained or printed but not which blocks are evaluated, or how.
    TRAINING_ONLY: ClassVar[tuple[str, ...]] = ("max_train_samples", "preprocessing_num_workers", "sample_max_new_tokens")

    dataset_name: str | None = field(
        default=None,
        metadata={"help": f"A `datasets` name, e.g. 'wikitext'; or a generated depth task (run_clm.py): {', '.join(HOP_TASKS)}."},
    )
    dataset_config_name: str | None = field(
        default=None,
        metadata={
            "help": "e.g. 'wikitext-2-raw-v1'; for a generated task its settings, e.g. "
            + "; ".join(f"{name}: '{task.example_settings}'" for name, task in HOP_TASKS.items())
        },
    )
    train_file: str | None = field(default=None, metadata={"help": "Training data: a .txt, .json/.jsonl or .csv file."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Evaluation data, same formats; without training data, evaluated alone (--do_eval)."}
    )
    text_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the text (default: 'text', else the first column, said in the log)."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={
            "help": "Share of the train split used for evaluation when there is no validation split: its last rows, or "
            "with --streaming (a stream's end is unknown) the rows whose index modulo 100 is below it."
        },
    )
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per training example; at most the model's context (default: min(context, 1024))."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the training set (debugging)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the evaluation set."})
    mlm_probability: float | None = field(
        default=None,
        metadata={"help": f"run_mlm.py: share of tokens masked (default {DEFAULT_MLM_PROBABILITY}, BERT's); run_clm.py masks none."},
    )
    keep_linebreaks: bool = field(default=True, metadata={"help": "Keep line breaks of .txt files."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Read the data as a stream (`datasets` streaming: an IterableDataset, tokenized as training reads it) "
            "instead of loading and tokenizing it all first. Training needs --max_steps; evaluation needs "
            "--max_eval_samples (that many blocks of the validation split are read). Blocks come in the stream's "
            "order, and a source without a validation split holds out every row whose index modulo 100 is below "
            "--validation_split_percentage."
        },
    )
    sample_max_new_tokens: int = field(
        default=60,
        metadata={
            "help": "Tokens of the sample printed after training on text (run_clm.py; run_mlm.py prints a filled-in mask "
            "unless 0); 0 prints none. The generated tasks print accuracy by hop count instead."
        },
    )
    serving_output_dir: str | None = field(
        default=None,
        metadata={
            "help": "Also write the final model here for serving engines, in the looped format of llama.cpp (each "
            "distinct block stored once; hf_layertie.save_for_serving): a tied Llama whose map is cycle:U. Another "
            "model or map is refused (before training where the map is fixed); docs/serving.md."
        },
    )

    def __post_init__(self):
        check_removed_task(self.dataset_name)
        if self.dataset_name in HOP_TASKS:
            self._check_generated_task()
            if self.streaming:
                raise ValueError(
                    f"--streaming reads text data as a stream; --dataset_name {self.dataset_name} is generated in memory: "
                    f"drop --streaming"
                )
        files = [f"--{name} {getattr(self, name)}" for name in ("train_file", "validation_file") if getattr(self, name) is not None]
        if self.dataset_name is not None and files:
            raise ValueError(
                f"--dataset_name {self.dataset_name} and {' and '.join(files)} both name the data, and the dataset's "
                f"splits would be read with the file{'s' if len(files) > 1 else ''} ignored: pass one or the other"
            )
        for name in ("block_size", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name} must be a positive integer, got {value!r}")
        if self.mlm_probability is not None and not 0 < self.mlm_probability < 1:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(f"--validation_split_percentage must be in (0, 100), got {self.validation_split_percentage}")
        if isinstance(self.sample_max_new_tokens, bool) or not isinstance(self.sample_max_new_tokens, int) or self.sample_max_new_tokens < 0:
            raise ValueError(f"--sample_max_new_tokens must be an integer >= 0, got {self.sample_max_new_tokens!r}")


    def _check_generated_task(self) -> None:
        """Refuse the text-only data arguments (they would be ignored) and read the task's settings, so that both are
        reported before anything loads."""
        name = self.dataset_name
        given = changed_from_default(self, TEXT_ONLY_ARGUMENTS)
        if given:
            raise ValueError(
                f"--dataset_name {name} generates its examples, and their length, from --dataset_config_name: it reads no "
                f"{', '.join(given)}. Leave {'it' if len(given) == 1 else 'them'} unset (sizes go in --dataset_config_name, "
                f"e.g. '{HOP_TASKS[name].example_settings}')"
            )
        hop_task_config(name, self.dataset_config_name)

    def evaluation_settings(self) -> dict[str, Any]:
        """The settings that pick and shape the evaluated blocks (every one but `TRAINING_ONLY`): saved beside an
        evaluation, so that a finished run asked again for one of other data is evaluated again, not answered with
        the saved one."""
        return {name: value for name, value in asdict(self).items() if name not in self.TRAINING_ONLY}

    @property
    def masked_share(self) -> float:
        """The share of tokens run_mlm.py masks: `--mlm_probability`, else the default."""
        return DEFAULT_MLM_PROBABILITY if self.mlm_probability is None else self.mlm_probability
