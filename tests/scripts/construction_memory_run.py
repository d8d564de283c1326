"""How much building a tied model raises the process's peak memory (VmHWM), each build from the same baseline.

Run in a fresh process (`python construction_memory_run.py KIND OUTPUT_DIR`, KIND `gpt2` or `llama`): it imports
everything and builds a tiny model once (lazy imports and first-call allocations), then forks one child per build,
so that every build starts from this post-import baseline. Each child prints how far its build raised the peak
above the baseline, in MiB, as one JSON line `{"build": rise}`:

- `tied`: 48 blocks of width 512 tied to 8 (`cycle:8`), built from the config;
- `untied`: 8 blocks of width 512, nothing tied;
- `loaded`: `from_pretrained` of the `tied` model saved by its child.
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402

from hf_layertie import (  # noqa: E402
    TiedGPT2Config,
    TiedGPT2LMHeadModel,
    TiedLlamaConfig,
    TiedLlamaForCausalLM,
    parse_strategy,  # noqa: E402
)

torch.set_num_threads(1)
NUM_BLOCKS, NUM_DISTINCT, WIDTH = 48, 8, 512


def config(kind: str, num_blocks: int, tying_map=None):
    if kind == "gpt2":
        return TiedGPT2Config(
            n_layer=num_blocks, n_embd=WIDTH, n_head=8, vocab_size=1024, n_positions=256, bos_token_id=0,
            eos_token_id=0, tying_map=tying_map,
        )  # fmt: skip
    return TiedLlamaConfig(
        num_hidden_layers=num_blocks, hidden_size=WIDTH, intermediate_size=1376, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=1024, max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
        tying_map=tying_map,
    )  # fmt: skip


def peak_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))


def rise_in_child(build, then=None) -> float:
    """Fork, run `build` in the child and return how far it raised the child's peak above the fork's; `then` gets
    the built model after the peak is read (what it does is not measured)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            baseline = peak_mib()
            model = build()
            os.write(write, json.dumps(peak_mib() - baseline).encode())
            if then is not None:
                then(model)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not text:
        raise RuntimeError(f"the child building the model failed (wait status {status})")
    return json.loads(text)


def main(kind: str, output_dir: str) -> None:
    model_class = TiedGPT2LMHeadModel if kind == "gpt2" else TiedLlamaForCausalLM
    model_class(config(kind, 2, [0, 0]))  # imports and first-call allocations, before the baseline
    tying_map = parse_strategy(f"cycle:{NUM_DISTINCT}", NUM_BLOCKS).to_list()
    saved = os.path.join(output_dir, f"tied-{kind}")
    rises = {
        "tied": rise_in_child(
            lambda: model_class(config(kind, NUM_BLOCKS, tying_map)), then=lambda model: model.save_pretrained(saved)
        ),
        "untied": rise_in_child(lambda: model_class(config(kind, NUM_DISTINCT))),
        "loaded": rise_in_child(lambda: model_class.from_pretrained(saved)),
    }
    print(json.dumps(rises))


if __name__ == "__main__":
    main(*sys.argv[1:])
