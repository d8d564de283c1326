"""Train one model under one tying strategy with `TyingTrainer` and measure it.

Everything that is not measurement is the project's own code path (the one `run_clm.py` takes): the
embedded Shakespeare corpus split by play, the embedded GPT-2 tokenizer, `tokenize_and_group`, the
reward batch held out from training, `TiedGPT2LMHeadModel` and `TyingTrainer`.
"""

from __future__ import annotations

import gc
import math
import resource
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import torch
from transformers import PreTrainedTokenizerBase, TrainerCallback, default_data_collator, set_seed

from hf_layertie.language_modeling import DataTrainingArguments, ModelArguments
from hf_layertie.language_modeling.data import (
    hold_out_reward_batch,
    load_raw_datasets,
    text_column,
    tokenize_and_group,
)
from hf_layertie.language_modeling.run import CAUSAL_LM, load_model, load_tokenizer
from hf_layertie.models import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.trainer import TyingTrainer, TyingTrainingArguments, plot_tying_history

from .settings import BenchSettings, distinct_counts

# fp32 weight + gradient + Adam's two moments: the least memory training a parameter with AdamW can take.
FP32_ADAM_BYTES_PER_PARAMETER = 4 * 4


@dataclass(frozen=True)
class TrainingStateBytes:
    """Bytes held by the live training state: parameters, gradients and optimizer state."""

    parameters: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def _tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def measure_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingStateBytes:
    """Sum the live tensors: each distinct Parameter once (tied blocks share them), its `.grad`, and every
    tensor in the optimizer's state (Adam's moments and step counters)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
    parameters = list(model.parameters())  # deduplicated by object: a shared Parameter counts once
    state_tensors = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return TrainingStateBytes(
        parameters=sum(_tensor_bytes(parameter) for parameter in parameters),
        gradients=sum(_tensor_bytes(parameter.grad) for parameter in parameters if parameter.grad is not None),
        optimizer=sum(_tensor_bytes(tensor) for tensor in state_tensors),
    )


class TrainingStateMeter(TrainerCallback):
    """Measures the training state after every optimizer step, while the gradients still exist (the Trainer
    zeroes them right after `on_optimizer_step`). Keeps the last measurement and the largest one."""

    def __init__(self, trainer: TyingTrainer):
        self.trainer = trainer
        self.last: TrainingStateBytes | None = None
        self.peak: TrainingStateBytes | None = None

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.last = measure_training_state(self.trainer.model, self.trainer.optimizer)
        if self.peak is None or self.last.total > self.peak.total:
            self.peak = self.last


def gpt2_block_parameters(config: TiedGPT2Config) -> int:
    """Parameters of one GPT-2 block: attention (4 d^2 + 4 d), MLP (2 d i + i + d), two layer norms (4 d)."""
    hidden, inner = config.n_embd, config.n_inner or 4 * config.n_embd
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden


def gpt2_non_block_parameters(config: TiedGPT2Config) -> int:
    """Token and position embeddings, the final layer norm, and the LM head unless it is the token embedding."""
    hidden = config.n_embd
    head = 0 if config.tie_word_embeddings else config.vocab_size * hidden
    return config.vocab_size * hidden + config.n_positions * hidden + 2 * hidden + head


def analytic_floor_bytes(config: TiedGPT2Config, distinct_blocks: int) -> int:
    """4 x 4 bytes x (non-block parameters + distinct blocks x parameters per block): fp32 weights, gradients
    and AdamW's two moments, each distinct parameter once. Activations and buffers come on top."""
    parameters = gpt2_non_block_parameters(config) + distinct_blocks * gpt2_block_parameters(config)
    return FP32_ADAM_BYTES_PER_PARAMETER * parameters


def peak_memory() -> tuple[int, str]:
    """The process's peak: allocated CUDA memory on a GPU, else the maximum resident set size."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated"
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return max_rss * (1 if sys.platform == "darwin" else 1024), "cpu_max_rss"


def checkpoint_bytes(model: TiedGPT2LMHeadModel) -> int:
    """Size of the safetensors files `save_pretrained` writes (each shared tensor is stored once)."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


# ----- data and model, through the project's own functions -----


@dataclass
class ShakespeareBlocks:
    train: datasets.Dataset
    reward: datasets.Dataset
    validation: datasets.Dataset


def load_shakespeare(
    settings: BenchSettings, tokenizer: PreTrainedTokenizerBase, training_args: TyingTrainingArguments
) -> ShakespeareBlocks:
    """The embedded corpus in blocks: training plays minus the held-out reward batch, and the validation plays."""
    raw = load_raw_datasets(DataTrainingArguments(), ModelArguments())
    grouped = tokenize_and_group(raw, tokenizer, text_column(raw, None), settings.block_size, training_args)
    train, reward = hold_out_reward_batch(grouped["train"], settings.reward_batch_size)
    return ShakespeareBlocks(
        train=train, reward=reward, validation=_first(grouped["validation"], settings.max_eval_blocks)
    )


def _load_wikitext(
    settings: BenchSettings, tokenizer: PreTrainedTokenizerBase, training_args: TyingTrainingArguments, path: Path
) -> datasets.Dataset | None:
    if not path.is_file():
        return None
    # Read as run_clm.py reads a --validation_file. `tokenize_and_group` works on a train/validation pair, so the
    # file fills both; datasets caches the tokenization, so later runs read it from disk.
    raw = load_raw_datasets(DataTrainingArguments(train_file=str(path), validation_file=str(path)), ModelArguments())
    blocks = tokenize_and_group(raw, tokenizer, text_column(raw, None), settings.block_size, training_args)[
        "validation"
    ]
    cap = None if settings.wikitext_max_tokens is None else max(1, settings.wikitext_max_tokens // settings.block_size)
    return _first(blocks, cap)


def _first(dataset: datasets.Dataset, count: int | None) -> datasets.Dataset:
    return dataset if count is None else dataset.select(range(min(count, len(dataset))))


def build_model(tokenizer: PreTrainedTokenizerBase, num_blocks: int, hidden: int, heads: int, block_size: int):
    """A TiedGPT2 from scratch, every block independent (the strategy is the trainer's business)."""
    overrides = f"n_layer={num_blocks},n_embd={hidden},n_head={heads},n_positions={block_size}"
    return load_model(CAUSAL_LM, ModelArguments(config_overrides=overrides), tokenizer)


def training_arguments(
    settings: BenchSettings, strategy: str, output_dir: Path, max_steps: int, batch_size: int
) -> TyingTrainingArguments:
    return TyingTrainingArguments(
        output_dir=str(output_dir),
        tying_strategy=strategy,
        tying_interval=settings.tying_interval,
        epsilon_decay=settings.epsilon_decay,
        reward_batch_size=settings.reward_batch_size,
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        learning_rate=settings.learning_rate,
        warmup_steps=settings.warmup_steps,
        seed=settings.seed,
        use_cpu=not settings.use_gpu,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=max(1, max_steps // 10),
        report_to=[],
        disable_tqdm=True,
        tying_plot=False,
    )


def _prepare_process(settings: BenchSettings) -> None:
    if settings.use_gpu and not torch.cuda.is_available():
        raise RuntimeError("--preset gpu needs a CUDA device, and torch.cuda.is_available() is False here")
    if settings.num_threads is not None:
        torch.set_num_threads(settings.num_threads)
    datasets.disable_progress_bars()


# ----- one strategy -----


def run_strategy(settings: BenchSettings, strategy: str, run_dir: Path, wikitext: Path) -> dict:
    """Train the bench model under `strategy` and return every measurement of the run (JSON-ready)."""
    _prepare_process(settings)
    tokenizer = load_tokenizer(CAUSAL_LM, ModelArguments())
    args = training_arguments(settings, strategy, run_dir, settings.max_steps, settings.batch_size)
    data = load_shakespeare(settings, tokenizer, args)
    wikitext_blocks = _load_wikitext(settings, tokenizer, args, wikitext)
    set_seed(settings.seed)  # the same initial weights for every strategy
    model = build_model(tokenizer, settings.n_layer, settings.n_embd, settings.n_head, settings.block_size)
    trainer = TyingTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        reward_dataset=data.reward,
        data_collator=default_data_collator,
        processing_class=tokenizer,
    )
    meter = TrainingStateMeter(trainer)
    trainer.add_callback(meter)

    train_metrics = trainer.train().metrics
    peak_bytes, peak_kind = peak_memory()  # before evaluation: the peak of training
    train_tokens = (
        trainer.state.global_step * args.train_batch_size * args.gradient_accumulation_steps * settings.block_size
    )
    shakespeare_loss = trainer.evaluate(eval_dataset=data.validation, metric_key_prefix="shakespeare")[
        "shakespeare_loss"
    ]
    tying_map = model.tying_map
    counts = model.parameter_counts()
    result = {
        "strategy": strategy,
        "dynamic": args.is_dynamic,
        "final_map": tying_map.to_list(),
        "map_text": tying_map.render(),
        "distinct_blocks": tying_map.num_distinct,
        "num_blocks": len(tying_map),
        "trainable_parameters": counts.trainable,
        "block_parameters": counts.blocks,
        "shakespeare_loss": shakespeare_loss,
        "shakespeare_perplexity": perplexity(shakespeare_loss),
        "shakespeare_eval_tokens": len(data.validation) * settings.block_size,
        **_wikitext_result(trainer, wikitext_blocks, wikitext, settings.block_size),
        "state_bytes": meter.last.to_dict(),
        "state_bytes_peak": meter.peak.total,
        "analytic_floor_bytes": analytic_floor_bytes(model.config, tying_map.num_distinct),
        "peak_memory_bytes": peak_bytes,
        "peak_memory_kind": peak_kind,
        "train_seconds": train_metrics["train_runtime"],
        "train_tokens": train_tokens,
        "tokens_per_second": train_tokens / train_metrics["train_runtime"],
        "torch_threads": torch.get_num_threads(),
        "tying_seconds": trainer.tying_seconds,
        "agent_overhead_share": trainer.tying_seconds / train_metrics["train_runtime"] if args.is_dynamic else None,
        "tying_decisions": len(trainer.tying_records) if args.is_dynamic else 0,
        "checkpoint_bytes": checkpoint_bytes(model),
    }
    if args.is_dynamic:
        plot_tying_history(trainer.tying_records, run_dir / "tying_map.png", final_step=trainer.state.global_step)
    return result


def _wikitext_result(trainer: TyingTrainer, blocks: datasets.Dataset | None, path: Path, block_size: int) -> dict:
    if blocks is None:
        return {
            "wikitext_loss": None,
            "wikitext_perplexity": None,
            "wikitext_eval_tokens": 0,
            "wikitext_missing": str(path),
        }
    loss = trainer.evaluate(eval_dataset=blocks, metric_key_prefix="wikitext")["wikitext_loss"]
    return {
        "wikitext_loss": loss,
        "wikitext_perplexity": perplexity(loss),
        "wikitext_eval_tokens": len(blocks) * block_size,
        "wikitext_missing": None,
    }


# ----- memory sweep -----


def run_memory_sweep(settings: BenchSettings) -> list[dict]:
    """For each depth L of the sweep and U = 1, 2, 4, ..., L: a few steps of `static:sequence:U`, with the live
    training state measured against the analytic floor."""
    _prepare_process(settings)
    tokenizer = load_tokenizer(CAUSAL_LM, ModelArguments())
    with tempfile.TemporaryDirectory() as work_dir:
        data_args = training_arguments(
            settings, "none", Path(work_dir), settings.memory_steps, settings.memory_batch_size
        )
        train = load_shakespeare(settings, tokenizer, data_args).train
        return [
            _measure_memory(settings, tokenizer, train, depth, distinct, Path(work_dir))
            for depth in settings.memory_depths
            for distinct in distinct_counts(depth)
        ]


def _measure_memory(
    settings: BenchSettings, tokenizer, train: datasets.Dataset, depth: int, distinct: int, work_dir: Path
) -> dict:
    strategy = f"static:sequence:{distinct}"
    args = training_arguments(
        settings, strategy, work_dir / f"L{depth}-U{distinct}", settings.memory_steps, settings.memory_batch_size
    )
    set_seed(settings.seed)
    model = build_model(tokenizer, depth, settings.memory_n_embd, settings.memory_n_head, settings.block_size)
    trainer = TyingTrainer(model=model, args=args, train_dataset=train, data_collator=default_data_collator)
    meter = TrainingStateMeter(trainer)
    trainer.add_callback(meter)
    if torch.cuda.is_available():
        gc.collect()  # the previous model (kept alive by a trainer <-> callback cycle) must not count in this peak
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    return {
        "num_blocks": depth,
        "strategy": strategy,
        "distinct_blocks": model.tying_map.num_distinct,
        "trainable_parameters": model.parameter_counts().trainable,
        "state_bytes": meter.last.to_dict(),
        "analytic_floor_bytes": analytic_floor_bytes(model.config, model.tying_map.num_distinct),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }
