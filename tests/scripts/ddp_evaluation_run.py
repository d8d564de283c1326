"""Score k-hop induction and LAMBADA on two processes; each rank writes the scores it got.

Launched by tests/trainer/test_distributed.py (`accelerate launch --multi_gpu --num_processes 2 ... OUTPUT_DIR`), which
compares them with the scores one process gets from `evaluation_scores()`.
"""

import json
import sys

import torch
from accelerate import PartialState

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainingArguments
from hf_layertie.data import LAMBADA_TEST_FILE
from hf_layertie.lambada.evaluation import evaluate_lambada
from hf_layertie.lambada.reader import read_lambada_jsonl
from hf_layertie.language_modeling.generated_tasks import evaluate_hop_task, hop_task_tokenizer, load_hop_task
from hf_layertie.toolkit import load_tokenizer

HOP_TASK = "length=16,max_hops=2,train_examples=8,eval_examples=11"  # 11 examples in batches of 3: uneven shares


def _model(vocab_size: int) -> TiedGPT2LMHeadModel:
    torch.manual_seed(0)
    config = TiedGPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=64, vocab_size=vocab_size, tying_map=[0, 0])
    return TiedGPT2LMHeadModel(config).eval()


def evaluation_scores() -> dict:
    """Both evaluations of a tiny untrained model, as every process of a launch gets them."""
    hop_tokenizer = hop_task_tokenizer("hop_induction", HOP_TASK)
    hop_data = load_hop_task("hop_induction", HOP_TASK, context=64, seed=0)["validation"]
    tokenizer = load_tokenizer("shakespeare-bpe")
    passages = read_lambada_jsonl(LAMBADA_TEST_FILE)[:7]
    return {
        "k-hop": evaluate_hop_task(_model(len(hop_tokenizer)), hop_data, batch_size=3),
        "lambada": evaluate_lambada(_model(len(tokenizer)), tokenizer, passages, batch_size=3, show_progress=False),
    }


def main():
    # As in the scripts, the training arguments set up the process group (gloo on CPU) that the evaluations share.
    TyingTrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[]).device
    assert PartialState().num_processes == 2
    forwards = []  # the model's forward passes on this process: one per batch it scores
    counting = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: forwards.append(1) if isinstance(module, TiedGPT2LMHeadModel) else None
    )
    scores = evaluation_scores()
    counting.remove()
    rank = PartialState().process_index
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as file:
        json.dump(scores | {"forward_passes": len(forwards)}, file)


if __name__ == "__main__":
    from launched import run_then_exit

    run_then_exit(main)
