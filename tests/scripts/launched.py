"""What the multi-process test scripts share: the tiny re-tying run they train, and how each ends (imported by its
siblings, which run with this folder on sys.path). The run's data and arguments are the suite's own
(`helpers.training`): this puts tests/ on sys.path, as pytest does for the suite."""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.training import token_dataset, tying_args  # noqa: E402

from hf_layertie import TIED_MODELS, TyingTrainer  # noqa: E402
from hf_layertie.toolkit import process_group_ended  # noqa: E402

# Tiny model sizes by plain model type.
SIZES = {
    "gpt2": dict(n_layer=4, n_embd=32, n_head=2, n_positions=32),
    # Grouped-query attention: 4 query heads share 2 key/value heads.
    "llama": dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32),
}  # fmt: skip


def random_tying_trainer(output_dir: str, max_steps: int, rows: int, model_name: str = "gpt2", **settings) -> TyingTrainer:
    """A tiny tied model (`SIZES[model_name]`) on `rows` random 16-token rows, every block tied to block 0 at the
    start and re-tied at random every 2 steps: many re-ties, the same on every rank. `settings` add to or replace
    the `TyingTrainingArguments`."""
    model_class, _ = TIED_MODELS[f"tied_{model_name}"]
    torch.manual_seed(0)
    config = model_class.config_class(**SIZES[model_name], vocab_size=100, bos_token_id=0, eos_token_id=0)
    data = token_dataset(rows=rows)
    random_ties = dict(tying_strategy="random", tying_initial_map="all", agent_seed=3, max_steps=max_steps)
    args = tying_args(output_dir, **{**random_ties, **settings})
    return TyingTrainer(model=model_class(config), args=args, train_dataset=data, eval_dataset=data.select(range(8)))


def run_then_exit(main) -> None:
    """Run `main` inside `process_group_ended()` (the group is destroyed after main's objects are freed), then leave.

    Everything the test reads is written by then. gloo can still abort an interpreter that finalizes after its work
    (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291): leave without finalizing.
    """
    with process_group_ended():
        main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
