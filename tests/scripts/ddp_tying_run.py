"""Train a tiny tied model with re-ties under several processes; each rank dumps its final map and weights.

Launched by tests/test_distributed.py exactly as the README tells users to launch:
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/scripts/ddp_tying_run.py OUTPUT_DIR MODEL`,
where MODEL is a key of `SIZES` (default gpt2).
"""

import sys

import datasets
import torch

from hf_layertie import TIED_MODELS, TyingTrainer, TyingTrainingArguments
from launched import run_then_exit


def main():
    SIZES = {
        "gpt2": dict(n_layer=4, n_embd=32, n_head=2, n_positions=32),
        # Grouped-query attention: 4 query heads share 2 key/value heads.
        "llama": dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32),
    }  # fmt: skip

    output_dir = sys.argv[1]
    model_name = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
    model_class, _ = TIED_MODELS[f"tied_{model_name}"]
    torch.manual_seed(0)
    config = model_class.config_class(**SIZES[model_name], vocab_size=100, bos_token_id=0, eos_token_id=0)
    model = model_class(config)
    ids = torch.randint(0, 100, (128, 16), generator=torch.Generator().manual_seed(1)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = TyingTrainingArguments(
        output_dir=output_dir,
        tying_strategy="random",
        tying_initial_map="all",
        tying_interval=2,
        max_steps=24,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        agent_seed=3,
    )
    trainer = TyingTrainer(model=model, args=args, train_dataset=data, eval_dataset=data.select(range(8)))
    trainer.train()
    rank = trainer.args.process_index
    torch.save(
        {
            "world_size": trainer.args.world_size,
            "map": model.tying_map.to_list(),
            "maps": [record["map"] for record in trainer.tying_records],
            "state_dict": {name: tensor.clone() for name, tensor in model.state_dict().items()},
        },
        f"{output_dir}/rank{rank}.pt",
    )


if __name__ == "__main__":
    run_then_exit(main)
