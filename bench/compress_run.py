"""One row of `bench/compress.py` for one seed: build its starting model, train it with `TyingTrainer`, measure.

The conversions take the path `run_clm.py --model_name_or_path <teacher> --tying_strategy ... --tie_init ...` takes:
the teacher, a plain checkpoint, loaded untied into its family's tied class (`load_model`), the strategy's first map
applied by the trainer. Every row also exports its trained model (`to_untied()`), loads the export with stock
transformers and records the largest logit difference. A distilled row (`Row.distill`) trains with
`distill_from=<its seed's teacher>` at the trainer's default temperature and weight, whatever it starts from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, default_data_collator, set_seed

from hf_layertie import TiedGPT2LMHeadModel
from hf_layertie.block_similarity import block_angular_distances, similarity_tying_map
from hf_layertie.decisions import DECISIONS
from hf_layertie.toolkit import load_model
from hf_layertie.trainer import TyingTrainer, TyingTrainingArguments

from .compress_settings import TEACHER_DIRS, CompressSettings, Row, teacher_ready
from .measure import RunMeter, build_model, hop_accuracy, process_peak_bytes, study_data
from .scheduling import write_complete

# The study's GPT-2 sizes in each family's config fields; Llama's MLP as wide as GPT-2's (4 x the hidden size).
SIZE_FIELDS = {
    "tied_gpt2": "n_layer={layers},n_embd={hidden},n_head={heads},n_positions={context}",
    "tied_llama": (
        "num_hidden_layers={layers},hidden_size={hidden},num_attention_heads={heads},num_key_value_heads={heads},"
        "intermediate_size={mlp},max_position_embeddings={context}"
    ),
}
# Uptraining batches come in another order than the teacher's (its data seed plus this), the same for every row.
UPTRAIN_DATA_SEED_OFFSET = 1000


def run_row(settings: CompressSettings, row: Row, seed: int, run_dir: Path, seed_dir: Path) -> dict:
    """Train and measure `row` for `seed`; the teacher of the seed is trained first if it is not there yet (and the
    row reads it: starts from it or distils from it)."""
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    tokenizer, blocks = study_data(settings.block_size, settings.max_test_blocks, max_validation_blocks=settings.max_validation_blocks, task=settings.task)
    teacher = seed_dir / TEACHER_DIRS[row.model_type]
    if row.needs_teacher and not teacher_ready(seed_dir, row.model_type):
        _train_teacher(settings, row.model_type, seed, blocks, tokenizer, teacher)

    set_seed(seed)
    model, teacher_blocks = _starting_model(settings, row, teacher, tokenizer, blocks["train"])
    scratch = row.start == "scratch"
    steps = settings.uptrain_steps + (settings.teacher_steps if row.all_tokens else 0)
    args = _arguments(
        settings,
        run_dir,
        seed,
        steps=steps,
        # From scratch, the study's schedule (what a user would train a small model with); uptraining, its own.
        learning_rate=settings.teacher_learning_rate if scratch else settings.uptrain_learning_rate,
        warmup_steps=settings.warmup_steps if scratch else 0,
        data_seed=seed if row.all_tokens else seed + UPTRAIN_DATA_SEED_OFFSET,
        tying=_tying_settings(settings, row),
        distill_from=str(teacher) if row.distill else None,
    )
    trainer = TyingTrainer(model=model, args=args, train_dataset=blocks["train"], data_collator=default_data_collator)
    meter = RunMeter(trainer)
    trainer.add_callback(meter)
    train_metrics = trainer.train().metrics
    train_seconds = train_metrics["train_runtime"]
    peak_bytes, peak_kind = process_peak_bytes()
    losses = {split: trainer.evaluate(eval_dataset=blocks[split], metric_key_prefix=split)[f"{split}_loss"] for split in ("validation", "test")}
    accuracy = hop_accuracy(model, blocks) if settings.task is not None else {}
    teacher_result = json.loads((teacher / "teacher_result.json").read_text()) if row.needs_teacher else None
    return {
        "label": row.label,
        "seed": seed,
        "model_type": row.model_type,
        "map_choice": row.strategy.removeprefix("static:").split(":")[0] if row.strategy != "none" else row.start,
        "tie_init": row.tie_init,
        "untie_init": row.untie_init,
        "lora_rank": row.lora_rank,
        "lora_init": row.lora_init,
        # The teacher as a path relative to the results folder (`seed<N>/teacher-model`), and the loss's settings.
        "distill": _distill_record(args, teacher, seed_dir.parent) if row.distill else None,
        "learning_rate": args.learning_rate,
        "train_steps": steps,
        "num_blocks": len(model.tying_map),
        "distinct_blocks": model.tying_map.num_distinct,
        "distinct_peak": max(meter.distinct_per_step),
        "final_map": model.tying_map.to_list(),
        "teacher_blocks": teacher_blocks,
        "trainable_parameters": model.parameter_counts().trainable,
        "validation_loss": losses["validation"],
        "test_loss": losses["test"],
        "teacher_test_loss": None if teacher_result is None else teacher_result["test_loss"],
        "teacher_mean_accuracy": None if teacher_result is None else teacher_result.get("mean_accuracy"),
        # Distilling: the frozen teacher's parameters, held beside the training state (in the process peak, not in it).
        "teacher_parameters_mib": train_metrics.get("teacher_parameters_mib"),
        "peak_state_bytes": meter.peak_state_bytes,
        "peak_process_bytes": peak_bytes,
        "peak_process_kind": peak_kind,
        "train_seconds": train_seconds,
        "export_logit_difference": _export_logit_difference(model, blocks["test"], run_dir / "export"),
        **accuracy,
    }


def _starting_model(settings: CompressSettings, row: Row, teacher: Path, tokenizer, train) -> tuple[PreTrainedModel, list[int] | None]:
    """The model `row` starts from (`Row.start`), and which of the teacher's blocks it keeps where it keeps only some
    (None otherwise)."""
    if row.start == "teacher":
        return load_model(row.model_type, tokenizer, str(teacher)), None
    if row.start == "truncated":
        return TiedGPT2LMHeadModel.from_pretrained(teacher, n_layer=settings.distinct_blocks), list(range(settings.distinct_blocks))
    if row.start == "pruned":
        return _pruned_teacher(teacher, settings.distinct_blocks, train)
    return _new_model(settings, row.model_type, settings.distinct_blocks, tokenizer), None


def _new_model(settings: CompressSettings, model_type: str, num_blocks: int, tokenizer):
    """A model of the family from scratch, every block independent, no dropout (the study's `build_model` for
    GPT-2)."""
    if model_type == "tied_gpt2":
        return build_model(tokenizer, num_blocks, settings.n_embd, settings.n_head, settings.block_size)
    sizes = dict(layers=num_blocks, hidden=settings.n_embd, heads=settings.n_head, mlp=4 * settings.n_embd, context=settings.block_size)
    return load_model(model_type, tokenizer, config_overrides=SIZE_FIELDS[model_type].format(**sizes))


@torch.no_grad()
def _export_logit_difference(model, test, folder: Path) -> float:
    """The largest logit difference between the trained model and its plain export (`to_untied()`, adapters merged)
    saved and loaded by stock transformers, on a test batch: the export users ship computes what was trained."""
    model.to_untied().save_pretrained(folder)
    try:
        exported = AutoModelForCausalLM.from_pretrained(folder).eval()
        batch = torch.tensor(test[:8]["input_ids"])
        return (model.eval()(input_ids=batch).logits - exported(input_ids=batch).logits).abs().max().item()
    finally:
        shutil.rmtree(folder)


def _pruned_teacher(teacher: Path, keep: int, train) -> tuple[TiedGPT2LMHeadModel, list[int]]:
    """The teacher with only the blocks `similarity:keep` would keep independent, measured on its first training
    batch of 16 blocks, in their order (`similarity_tying_map`, `block_angular_distances`); and those blocks."""
    full = TiedGPT2LMHeadModel.from_pretrained(teacher)
    batch = {"input_ids": torch.tensor(train[:16]["input_ids"])}
    kept = similarity_tying_map(block_angular_distances(full, batch), keep).independent_blocks
    model = TiedGPT2LMHeadModel.from_pretrained(teacher, n_layer=keep)  # embeddings, final norm, blocks 0..keep-1
    with torch.no_grad():
        for position, block in enumerate(kept):
            model.tied_blocks[position].load_state_dict(full.tied_blocks[block].state_dict())
    return model, kept


def _tying_settings(settings: CompressSettings, row: Row) -> dict:
    tying = dict(
        tying_strategy=row.strategy,
        tie_init=row.tie_init,
        untie_init=row.untie_init,
        tying_interval=settings.tying_interval,
        max_distinct_blocks=settings.distinct_blocks,
        tying_initial_map=f"sequence:{settings.distinct_blocks}",
        similarity_warmup_steps=0,  # measure the teacher as loaded
        lora_rank=row.lora_rank,
        lora_init=row.lora_init,
    )
    reads = DECISIONS[row.strategy.partition(":")[0]].setting_defaults()
    return {name: value for name, value in tying.items() if name == "tying_strategy" or (name in reads and value is not None)}


def _distill_record(args: TyingTrainingArguments, teacher: Path, results: Path) -> dict:
    """What a distilled row's record says of its distillation: the teacher (relative to the results folder) and the
    temperature and weight the trainer resolved (`TyingTrainingArguments`, its defaults here)."""
    return {"teacher": teacher.relative_to(results).as_posix(), "temperature": args.distillation_temperature, "alpha": args.distillation_alpha}


def _arguments(
    settings: CompressSettings,
    output_dir: Path,
    seed: int,
    *,
    steps: int,
    learning_rate: float,
    warmup_steps: int,
    data_seed: int,
    tying: dict,
    distill_from: str | None = None,
) -> TyingTrainingArguments:
    return TyingTrainingArguments(
        output_dir=str(output_dir),
        **tying,
        distill_from=distill_from,
        max_steps=steps,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=4 * settings.batch_size,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        seed=seed,
        data_seed=data_seed,
        use_cpu=True,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=max(1, steps // 10),
        report_to=[],
        disable_tqdm=True,
        tying_plot=False,
    )


def _train_teacher(settings: CompressSettings, model_type: str, seed: int, blocks, tokenizer, teacher: Path) -> None:
    """The `n_layer`-block model every conversion of its family starts from, trained conventionally as in the study; saved
    as a plain checkpoint with its test loss (written last: a teacher folder with `teacher_result.json` is
    complete)."""
    set_seed(seed)
    model = _new_model(settings, model_type, settings.n_layer, tokenizer)
    args = _arguments(
        settings, teacher, seed, steps=settings.teacher_steps, learning_rate=settings.teacher_learning_rate,
        warmup_steps=settings.warmup_steps, data_seed=seed, tying={"tying_strategy": "none"},
    )  # fmt: skip
    trainer = TyingTrainer(model=model, args=args, train_dataset=blocks["train"], data_collator=default_data_collator)
    trainer.train()
    model.to_untied().save_pretrained(teacher)
    test_loss = trainer.evaluate(eval_dataset=blocks["test"], metric_key_prefix="test")["test_loss"]
    record = {"test_loss": test_loss, "steps": settings.teacher_steps}
    if settings.task is not None:
        record["mean_accuracy"] = hop_accuracy(model, blocks)["mean_accuracy"]
    write_complete(teacher / "teacher_result.json", record)
