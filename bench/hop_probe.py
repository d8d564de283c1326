#!/usr/bin/env python
"""Does depth help on a generated task? Train one GPT-2 (untied, or tied by a fixed `--tying_map`) on it with a plain
AdamW loop and print accuracy by hop count as it goes.

    python bench/hop_probe.py --task "length=64,max_hops=4" --n_layer 2
    python bench/hop_probe.py --task "length=64,max_hops=4" --n_layer 4 --tying_map cycle:2

Every run of `bench/hop_depth.py` is one such process (bench/README.md, "The first measurement: fixed layouts
trained with a plain loop"): one thread, plain AdamW (warm-up 100 steps, linear decay, gradient clipping 1.0),
batches drawn with replacement from the training split; evaluation on the validation split four times over the run.
It was first a probe for choosing a task's difficulty, written for a task of chains of references since removed
(`git show ac75ab9:bench/multihop_probe.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import process_peak_bytes, training_state_bytes  # noqa: E402
from bench.provenance import provenance  # noqa: E402
from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, resolve_tying_map  # noqa: E402
from hf_layertie.language_modeling import HOP_TASKS, evaluate_hop_task  # noqa: E402

# The probe's split sizes unless --task sets them.
PROBE_SIZES = {"train_examples": 50000, "eval_examples": 500}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task_name", default="hop_induction", choices=sorted(HOP_TASKS))
    parser.add_argument("--task", default="length=64,max_hops=4", help="The task config's settings.")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tying_map", default=None, help="A fixed map of the n_layer blocks ('cycle:2', '0,1,0,1').")
    parser.add_argument("--result_file", default=None, help="Write the last evaluation, settings and time as JSON.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    source = provenance()  # the code this process loaded, not what the tree holds when it ends

    task = HOP_TASKS[args.task_name]
    given = {item.partition("=")[0].strip() for item in args.task.split(",")}
    sizes = [f"{key}={value}" for key, value in PROBE_SIZES.items() if key not in given]  # --task's own win
    config = task.config_class.from_string(",".join(sizes + [args.task]))
    splits = task.make_datasets(config, seed=0)
    train = splits["train"].with_format("torch", columns=["input_ids", "attention_mask", "labels"])
    torch.manual_seed(args.seed)
    tying_map = resolve_tying_map(args.tying_map or "independent", args.n_layer).to_list()
    model = TiedGPT2LMHeadModel(
        TiedGPT2Config(
            n_layer=args.n_layer, n_embd=args.n_embd, n_head=4, vocab_size=len(task.make_tokenizer(config)),
            n_positions=config.sequence_length, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0, tying_map=tying_map,
        )
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 100) * max(0.0, 1 - step / args.steps)
    )
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    peak_state_bytes = 0
    for step in range(1, args.steps + 1):
        batch = train[torch.randint(0, len(train), (args.batch_size,), generator=generator)]
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        peak_state_bytes = max(peak_state_bytes, training_state_bytes(model, optimizer))  # gradients still held
        schedule.step()
        optimizer.zero_grad()
        if step % max(1, args.steps // 4) == 0:
            scores = evaluate_hop_task(model, splits["validation"], batch_size=100)
            by_hops = " / ".join(f"{value:.2f}" for value in scores["accuracy_by_hops"].values())
            print(
                f"step {step}: answer loss {loss.item():.3f}, accuracy by hops {by_hops}, "
                f"mean {scores['mean_accuracy']:.3f} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    scores = evaluate_hop_task(model, splits["validation"], batch_size=100)  # the trained model, whatever the steps
    if args.result_file:
        result = {**vars(args), "tying_map": tying_map, "distinct_blocks": len(set(tying_map)), **scores}
        result.update(train_seconds=time.perf_counter() - started, trainable_parameters=model.parameter_counts().trainable)
        result.update(peak_state_bytes=peak_state_bytes, peak_process_bytes=process_peak_bytes()[0], **source)
        Path(args.result_file).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
