#!/usr/bin/env python
"""Train or fine-tune a tied GPT-2 (causal language modeling) with Dynamic Layer Tying.

    python run_clm.py                      # the embedded default: offline, a few minutes on 2 CPU cores
    python run_clm.py --help               # every flag (model, data, Trainer and tying arguments)
    python run_clm.py my_args.json         # flags from a JSON or YAML file
    accelerate launch run_clm.py ...       # several processes (docs/multi-process.md: CPU-only machines)
"""

from hf_layertie.language_modeling import CAUSAL_LM, run


def main():
    run(CAUSAL_LM)


if __name__ == "__main__":
    main()
