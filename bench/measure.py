"""Train one model under one tying strategy with `TyingTrainer`, and measure it.

Everything that is not measurement is the project's own code path, the one `run_clm.py` takes: the `datasets`
text builder, `tokenize_and_group`, `load_model`, `TiedGPT2LMHeadModel` and `TyingTrainer`. Measurements:

- training state: parameters + gradients + optimizer state, summed over live tensors after every optimizer step
  (the gradients still exist then), each shared Parameter once; the study reports its peak over the run;
- process peak: the resident set's high-water mark (`VmHWM`) on CPU (the whole process: Python, torch, data,
  activations), `torch.cuda.max_memory_allocated` on a GPU, read after training and before evaluation. A run with
  gradient checkpointing (`RunSpec.gradient_checkpointing`, transformers' own) keeps fewer activations and holds
  the same training state;
- distinct blocks after every step: final, mean over steps, peak;
- the agent's wall time by part (`TyingTrainer.tying_seconds`) against the training time.
"""

from __future__ import annotations

import resource
import statistics
import time
from pathlib import Path

import datasets
import torch
from transformers import (
    EarlyStoppingCallback,
    PreTrainedTokenizerBase,
    TrainerCallback,
    default_data_collator,
    set_seed,
)

from hf_layertie.data import SHAKESPEARE_DIR
from hf_layertie.decisions import DECISIONS
from hf_layertie.language_modeling import evaluate_hop_task, hop_task_tokenizer, load_hop_task
from hf_layertie.toolkit import bigram_loss, load_model, load_tokenizer, take_first, tokenize_and_group
from hf_layertie.trainer import TyingTrainer, TyingTrainingArguments, plot_tying_history

from .gradient_norms import GradientNorms
from .provenance import provenance
from .settings import BENCH_PLAYS_DIR, STUDY_SPLITS, BenchSettings, RunSpec

TOKENIZER = "shakespeare-bpe"


def training_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every distinct Parameter, its `.grad`, and every tensor in the optimizer's state."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
    parameters = list(model.parameters())  # deduplicated by object: a shared Parameter counts once
    tensors = parameters + [p.grad for p in parameters if p.grad is not None]
    tensors += [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


class RunMeter(TrainerCallback):
    """Peak training state (after each optimizer step, before the Trainer zeroes the gradients), the number of
    distinct blocks after each step, and the steps that trained under another map than the step before (when a
    moving map last moved: a move late in the cosine schedule, near a learning rate of zero, may cost)."""

    def __init__(self, trainer: TyingTrainer):
        self.trainer = trainer
        self.peak_state_bytes = 0
        self.distinct_per_step: list[int] = []
        self.map_change_steps: list[int] = []
        self._last_map: list[int] | None = None

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.peak_state_bytes = max(self.peak_state_bytes, training_state_bytes(self.trainer.model, self.trainer.optimizer))

    def on_step_end(self, args, state, control, **kwargs):
        tying_map = self.trainer.model.tying_map
        self.distinct_per_step.append(tying_map.num_distinct)
        current = tying_map.to_list()
        if self._last_map is not None and current != self._last_map:
            self.map_change_steps.append(state.global_step)
        self._last_map = current


class ValidationEarlyStopping(EarlyStoppingCallback):
    """transformers' early stopping on the validation loss, deaf to the other evaluations the Trainer reports through
    the same event (the test split's during training, both splits' after it), which would each warn that the
    validation loss is missing."""

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        if f"eval_{args.metric_for_best_model}" in metrics:
            super().on_evaluate(args, state, control, metrics, **kwargs)


def process_peak_bytes() -> tuple[int, str]:
    """The process's peak: allocated CUDA memory on a GPU, else the resident set's high-water mark (`VmHWM`, which
    starts afresh at `exec`, unlike `ru_maxrss`, which a child launched by a large parent inherits; in a run forked
    from a template, bench/scheduling.py, it starts from the template's pages, without the import's transient)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated(), "cuda_max_memory_allocated"
    status = Path("/proc/self/status")
    if status.is_file():
        high_water_kb = next(int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        return high_water_kb * 1024, "cpu_vm_hwm"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "cpu_max_rss_bytes_macos"


# ----- data and model -----


def study_files(train_works: tuple[str, ...] | None = None) -> dict[str, list[str]]:
    """All 42 works (9 shipped in the package, 33 in bench/data), split by `STUDY_SPLITS`; `train_works` (names
    such as "julius_caesar") narrows the training split to those works."""
    paths = {path.name.removesuffix("_gut.txt"): path for folder in (SHAKESPEARE_DIR, BENCH_PLAYS_DIR) for path in folder.glob("*_gut.txt")}
    held_out = {work for works in STUDY_SPLITS.values() for work in works}
    missing = held_out - paths.keys()
    if missing or len(paths) != 42:
        raise FileNotFoundError(f"The study reads 42 works from {SHAKESPEARE_DIR} and {BENCH_PLAYS_DIR}; found {len(paths)}, missing {sorted(missing)}")
    files = {split: [str(paths[work]) for work in works] for split, works in STUDY_SPLITS.items()}
    training = [work for work in sorted(paths) if work not in held_out]
    if train_works is not None:
        unknown = sorted(set(train_works) - set(training))
        if unknown:
            raise ValueError(f"train_works {unknown} are not training works; training works: {', '.join(training)}")
        training = list(train_works)
    files["train"] = [str(paths[work]) for work in training]
    return files


def study_blocks(
    tokenizer,
    block_size: int,
    max_test_blocks: int | None = None,
    train_works: tuple[str, ...] | None = None,
    max_validation_blocks: int | None = None,
) -> datasets.DatasetDict:
    """train / validation / test in blocks of `block_size` tokens, evaluation splits capped to their first blocks
    (`datasets` caches the tokenization)."""
    raw = datasets.load_dataset("text", data_files=study_files(train_works), keep_linebreaks=True)
    blocks = tokenize_and_group(raw, tokenizer, "text", block_size)
    blocks["test"] = take_first(blocks["test"], max_test_blocks)
    blocks["validation"] = take_first(blocks["validation"], max_validation_blocks)
    return blocks


def evaluation_coverage(split: str, block_size: int, cap: int | None) -> str:
    """In words, what an evaluation split's first `cap` blocks of `block_size` tokens hold: the split is its works in
    `STUDY_SPLITS`' order, tokenized line by line, concatenated and cut into blocks, so a cap keeps the first works'
    openings. Shares are approximate (each batch of lines drops its remainder when cut into blocks)."""
    works = STUDY_SPLITS[split]
    titles = [work.replace("_", " ").title() for work in works]
    if cap is None:
        return f"{len(works)} held-out plays ({', '.join(titles)})"
    tokenizer, left, shares = load_tokenizer(TOKENIZER), cap * block_size, []
    for title, path in zip(titles, study_files()[split]):
        if left <= 0:  # the cap ends before this work: nothing of it to tokenize
            break
        lines = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
        tokens = sum(len(ids) for ids in tokenizer(lines)["input_ids"])
        shares.append(f"{title} ({'all' if left >= tokens else f'its first {left / tokens:.0%}'})")
        left -= tokens
    return f"the first {cap:,} blocks of {block_size} tokens of the held-out plays, {cap * block_size:,} tokens: {', '.join(shares)}"


def study_data(
    block_size: int,
    max_test_blocks: int | None = None,
    train_works: tuple[str, ...] | None = None,
    max_validation_blocks: int | None = None,
    task: str | None = None,
) -> tuple[PreTrainedTokenizerBase, datasets.DatasetDict]:
    """The tokenizer and train / validation / test splits: the plays in blocks (`study_blocks`), or the generated
    `task`'s examples (the same ones for every seed: seeds vary weights and order)."""
    if task is not None:
        return task_data(task, block_size)
    tokenizer = load_tokenizer(TOKENIZER)
    return tokenizer, study_blocks(tokenizer, block_size, max_test_blocks, train_works, max_validation_blocks)


def settings_data(settings: BenchSettings) -> tuple[PreTrainedTokenizerBase, datasets.DatasetDict]:
    """`study_data` as a study's settings size it."""
    return study_data(settings.block_size, settings.max_test_blocks, settings.train_works, settings.max_validation_blocks, settings.task)


def task_data(task: str, context: int) -> tuple[PreTrainedTokenizerBase, datasets.DatasetDict]:
    """A generated task's tokenizer and splits from `<name>:<config>` (`--task`), checked to fit `context`."""
    name, _, config = task.partition(":")
    return hop_task_tokenizer(name, config), load_hop_task(name, config, context, seed=0)


def count_bigram_test_loss(settings: BenchSettings) -> float | None:
    """The count bigram of the same tokenization, trained on the training works, scored on the test blocks (None
    for a task, whose loss is on answers, not on every next token)."""
    if settings.task is not None:
        return None
    datasets.disable_progress_bars()
    tokenizer, blocks = settings_data(settings)
    return bigram_loss(blocks["train"]["input_ids"], blocks["test"]["input_ids"], len(tokenizer))


def build_model(tokenizer, num_blocks: int, hidden: int, heads: int, context: int, dropout: float = 0.0, looped_config=()):
    """A TiedGPT2 from scratch with every block independent; no dropout unless told (the default study sees each
    token about once; the paper's regime, many epochs of a small corpus, uses 0.2). `looped_config`: (name, value)
    pairs of the loop recipe's config fields and `skipped_positions` (`RunSpec.looped_config`)."""
    drop = ",".join(f"{name}={dropout}" for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"))
    overrides = f"n_layer={num_blocks},n_embd={hidden},n_head={heads},n_positions={context},{drop}"
    return load_model("tied_gpt2", tokenizer, config_overrides=overrides, looped_config=dict(looped_config))


def gradient_norm_interval(settings: BenchSettings, spec: RunSpec) -> int | None:
    """How often a run records gradient norms (and logs, at the same steps); None: not at all, as in memory runs."""
    return None if spec.kind == "memory" else settings.gradient_norm_interval


def training_arguments(settings: BenchSettings, spec: RunSpec, output_dir: Path) -> TyingTrainingArguments:
    memory = spec.kind == "memory"
    steps = settings.memory_steps if memory else settings.max_steps
    # Only the settings the strategy reads (TyingTrainingArguments refuses the others).
    tying = dict(
        tying_strategy=spec.strategy,
        dlt_variant=spec.dlt_variant,
        tying_interval=settings.memory_tying_interval if memory else settings.tying_interval,
        max_distinct_blocks=settings.memory_max_distinct_blocks if memory else settings.max_distinct_blocks,
        similarity_warmup_steps=steps // 10,
    )
    reads = DECISIONS[spec.strategy.partition(":")[0]].setting_defaults()
    tying = {name: value for name, value in tying.items() if name == "tying_strategy" or name in reads}
    tying.update(spec.tying)
    batch_size = settings.memory_batch_size if memory else settings.batch_size
    evaluated = bool(settings.eval_interval) and not memory
    # Named only when on: the name every transformers from 5.18 knows, which 5.23 warns about even when False.
    checkpointing = {"gradient_checkpointing": True} if spec.gradient_checkpointing else {}
    return TyingTrainingArguments(
        output_dir=str(output_dir),
        **tying,
        **checkpointing,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=4 * batch_size,
        learning_rate=spec.learning_rate or settings.learning_rate,
        warmup_steps=0 if memory else settings.warmup_steps,
        lr_scheduler_type=settings.lr_scheduler_type,
        weight_decay=settings.weight_decay,
        seed=spec.seed,
        data_seed=spec.seed,
        use_cpu=not settings.use_gpu,
        eval_strategy="steps" if evaluated else "no",
        eval_steps=settings.eval_interval,
        # what early stopping watches (the Trainer tracks its best without saving checkpoints)
        metric_for_best_model="validation_loss" if evaluated and settings.early_stopping_patience else None,
        save_strategy="no",
        logging_steps=gradient_norm_interval(settings, spec) or max(1, steps // 10),
        report_to=[],
        disable_tqdm=True,
        tying_plot=False,
    )


# ----- one run -----


def missing_device(settings: BenchSettings) -> str | None:
    """Why these settings cannot train here (a GPU preset without CUDA), or None."""
    if settings.use_gpu and not torch.cuda.is_available():
        return "--use_gpu (this preset trains on a GPU) needs a CUDA device, and torch.cuda.is_available() is False here"
    return None


def run(settings: BenchSettings, spec: RunSpec, run_dir: Path, model_dir: Path | None = None) -> dict:
    """Train and measure one run; the JSON-ready result. `model_dir`: where to save the trained model (weights,
    config and adapters, `save_pretrained`) once every measurement is taken, so that the record is the one a run
    without it writes (bench/loop_depth.py scores the model at other depths); None: the weights are not kept."""
    if problem := missing_device(settings):
        raise RuntimeError(problem)
    if settings.num_threads is not None:
        torch.set_num_threads(settings.num_threads)
    source = provenance(on_gpu=settings.use_gpu)  # the code this process loaded, not what the tree holds at its end
    if (registered := settings.registration_commit()) is not None:  # the registration governing the run, committed before it started
        source["preregistration_commit"] = registered
    datasets.disable_progress_bars()
    tokenizer, blocks = settings_data(settings)
    memory = spec.kind == "memory"
    args = training_arguments(settings, spec, run_dir)
    set_seed(spec.seed)  # the same initial weights for every strategy of a seed
    model = build_model(
        tokenizer,
        spec.num_blocks or settings.n_layer,
        settings.memory_n_embd if memory else settings.n_embd,
        settings.memory_n_head if memory else settings.n_head,
        settings.block_size,
        0.0 if memory else settings.dropout,
        spec.looped_config,
    )
    evaluated = {split: blocks[split] for split in ("validation", "test")} if args.eval_strategy != "no" else None
    trainer = TyingTrainer(
        model=model, args=args, train_dataset=blocks["train"], eval_dataset=evaluated, data_collator=default_data_collator
    )
    meter = RunMeter(trainer)
    trainer.add_callback(meter)
    norms = None
    if interval := gradient_norm_interval(settings, spec):
        norms = GradientNorms(model, interval)
        trainer.add_callback(norms)
    if args.metric_for_best_model is not None:
        trainer.add_callback(ValidationEarlyStopping(early_stopping_patience=settings.early_stopping_patience))
    train_seconds = trainer.train().metrics["train_runtime"]
    peak_bytes, peak_kind = process_peak_bytes()
    distinct = meter.distinct_per_step
    result = {
        "label": spec.label,
        "strategy": spec.strategy,
        "dlt_variant": spec.dlt_variant,
        "seed": spec.seed,
        "num_blocks": len(model.tying_map),
        "final_map": model.tying_map.to_list(),
        "distinct_final": model.tying_map.num_distinct,
        "distinct_mean": statistics.fmean(distinct),
        "distinct_peak": max(distinct),
        "map_change_steps": meter.map_change_steps,
        "trainable_parameters": model.parameter_counts().trainable,
        "peak_state_bytes": meter.peak_state_bytes,
        "peak_process_bytes": peak_bytes,
        "peak_process_kind": peak_kind,
        "train_seconds": train_seconds,
        "tying_seconds": trainer.tying_seconds,
        "tying_decisions": len(trainer.tying_records),
        "trained_steps": trainer.state.global_step,  # below max_steps where early stopping ended the run
        "gradient_checkpointing": bool(args.gradient_checkpointing),  # absent from earlier records: False
        **({"tying_settings": dict(spec.tying)} if spec.tying else {}),  # absent: the strategy's defaults
        **({"looped_config": dict(spec.looped_config)} if spec.looped_config else {}),  # absent: no loop recipe
        "learning_rate": args.learning_rate,
        **source,
    }
    if norms is not None:
        result["gradient_norms"] = norms.records
        result["training_log"] = training_log(trainer.state.log_history)
    if memory:
        result["retie_ms"] = retie_milliseconds(model)
    else:
        for split in ("validation", "test"):
            result[f"{split}_loss"] = trainer.evaluate(eval_dataset=blocks[split], metric_key_prefix=split)[f"{split}_loss"]
        result["test_tokens"] = len(blocks["test"]) * settings.block_size
        result.update(model_selection(trainer.state.log_history, trainer.state.global_step, result, meter.distinct_per_step))
        if settings.task is not None:
            result.update(hop_accuracy(model, blocks))
    if trainer.tying_records:
        plot_tying_history(trainer.tying_records, run_dir / "tying_map.png", final_step=trainer.state.global_step)
    if model_dir is not None:
        model.save_pretrained(model_dir)
    return result


def training_log(log_history: list[dict]) -> list[dict]:
    """The Trainer's training log rows: step, loss, gradient norm before clipping, learning rate."""
    keys = ("step", "loss", "grad_norm", "learning_rate")
    return [{key: row[key] for key in keys if key in row} for row in log_history if "loss" in row]


def hop_accuracy(model, splits: datasets.DatasetDict) -> dict:
    """Accuracy per hop count on the test split (`accuracy_by_hops`, `mean_accuracy`: the mean over hop counts) and
    the mean on validation, where settings are chosen."""
    test = evaluate_hop_task(model, splits["test"], batch_size=100)
    validation = evaluate_hop_task(model, splits["validation"], batch_size=100)
    return {
        "accuracy_by_hops": test["accuracy_by_hops"],
        "mean_accuracy": test["mean_accuracy"],
        "validation_mean_accuracy": validation["mean_accuracy"],
    }


def model_selection(log_history: list[dict], final_step: int, final: dict, distinct_per_step: list[int]) -> dict:
    """The paper's model selection from the losses measured during training (`eval_validation_loss` and
    `eval_test_loss` every `eval_interval` steps, as the Trainer logs them) and at the end: the step of the lowest
    validation loss, the test loss there, the distinct blocks of the map evaluated there (`RunMeter.distinct_per_step`:
    a moving map's selected model may have another budget than its final one), and the whole curve. Without
    evaluations during training the end is the only candidate."""
    measured: dict[int, dict] = {}  # the Trainer logs each evaluation dataset's metrics as an entry of its own
    for entry in log_history:
        for split in ("validation", "test"):
            if f"eval_{split}_loss" in entry and entry["step"] < final_step:
                measured.setdefault(entry["step"], {"step": entry["step"]})[f"{split}_loss"] = entry[f"eval_{split}_loss"]
    curve = [point for _, point in sorted(measured.items())]
    curve.append({"step": final_step, "validation_loss": final["validation_loss"], "test_loss": final["test_loss"]})
    for point in curve:  # evaluated after the step's optimizer step, under the map that step trained
        point["distinct_blocks"] = distinct_per_step[point["step"] - 1]
    best = min(curve, key=lambda point: point["validation_loss"])
    return {
        "best_validation_step": best["step"],
        "test_loss_at_best_validation": best["test_loss"],
        "distinct_at_best_validation": best["distinct_blocks"],
        "final_test_loss": final["test_loss"],
        "validation_curve": curve,
    }


def retie_milliseconds(model, repeats: int = 50) -> float:
    """Median wall time of `model.retie` for one decision, as training makes them: a random block takes a random
    one of its other options (independent, or an earlier block that owns weights) from the current map."""
    generator = torch.Generator().manual_seed(0)
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats):
        block = int(torch.randint(1, len(model.tying_map), (1,), generator=generator))
        options = [option for option in model.tying_map.decision_options(block) if option != model.tying_map[block]]
        source = options[int(torch.randint(0, len(options), (1,), generator=generator))]
        synchronize()
        started = time.perf_counter()
        model.retie(model.tying_map.with_decision(block, source))
        synchronize()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)
