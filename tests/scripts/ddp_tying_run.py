"""Train a tiny tied GPT-2 with re-ties under several processes; each rank dumps its final map and weights.

Launched by tests/test_tying_trainer_distributed.py exactly as the README tells users to launch:
`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/scripts/ddp_tying_run.py OUTPUT_DIR`.
"""

import sys

import datasets
import torch

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments

output_dir = sys.argv[1]
torch.manual_seed(0)
config = TiedGPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
model = TiedGPT2LMHeadModel(config)
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
