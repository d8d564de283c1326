#!/usr/bin/env python
"""Train or fine-tune a tied BERT (masked language modeling) with Dynamic Layer Tying.

    python run_mlm.py                      # the embedded default: offline, a few minutes on 2 CPU cores
    python run_mlm.py --help               # every flag (model, data, Trainer and tying arguments)
    python run_mlm.py my_args.json         # flags from a JSON or YAML file
    accelerate launch run_mlm.py ...       # several processes (docs/multi-process.md: CPU-only machines)
"""

from hf_layertie.language_modeling import MASKED_LM, run


def main():
    run(MASKED_LM)


if __name__ == "__main__":
    main()
