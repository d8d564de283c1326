"""Tiny settings for run_clm.py and run_mlm.py (`tiny_flags`, and `tiny_task_flags` on a generated task) and the
lines of a play to train them on."""

from hf_layertie.data.embedded import SHAKESPEARE_DIR

TINY_GPT2 = "n_layer=3,n_embd=16,n_head=2,n_positions=32"
TINY_BERT = "num_hidden_layers=3,hidden_size=16,num_attention_heads=2,intermediate_size=32,max_position_embeddings=32"


def play_lines(count, start=0):
    lines = (SHAKESPEARE_DIR / "julius_caesar_gut.txt").read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines[start : start + count] if line.strip())


def tiny_flags(output_dir, text_files, overrides, *extra):
    """A 6-step run on a few hundred lines; DLT (the default strategy) decides every 2 steps."""
    schedule = [] if "--tying_strategy" in extra else ["--tying_interval", "2"]
    return [
        "--train_file", str(text_files / "train.txt"),
        "--validation_file", str(text_files / "validation.txt"),
        "--config_overrides", overrides,
        "--block_size", "32",
        "--output_dir", str(output_dir),
        "--do_train", "--do_eval",
        "--max_steps", "6",
        *schedule,
        "--per_device_train_batch_size", "4",
        "--max_eval_samples", "8",
        "--report_to", "none",
        "--disable_tqdm", "true",
        *extra,
    ]  # fmt: skip


def tiny_task_flags(output_dir, task, config, *extra, n_positions=32, max_steps=1):
    """A 2-block GPT-2 trained on the generated `task` (`--dataset_name`) with its `config` settings."""
    return [
        "--dataset_name", task, "--dataset_config_name", config,
        "--config_overrides", f"n_layer=2,n_embd=16,n_head=2,n_positions={n_positions}",
        "--output_dir", str(output_dir), "--do_train", "--max_steps", str(max_steps), "--report_to", "none", *extra,
    ]  # fmt: skip
