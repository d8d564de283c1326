#!/usr/bin/env python
"""LAMBADA for tied causal checkpoints: last-word accuracy and target-word perplexity (lm-eval-harness
`lambada_openai` protocol), and fine-tuning with a fixed, documented hold-out.

    python run_lambada.py --model_name_or_path outputs/tied-gpt2-shakespeare --do_eval --output_dir outputs/lambada-eval
    python run_lambada.py --model_name_or_path outputs/tied-gpt2-shakespeare \\
        --lambada_file lambada_test.jsonl --do_train --do_eval --tying_strategy none --max_steps 200 \\
        --output_dir outputs/lambada-ft  # the checkpoint's own map (dlt, the default, restarts from all tied to 0)
    python run_lambada.py --help
"""

from hf_layertie.lambada.run import run_lambada


def main():
    run_lambada()


if __name__ == "__main__":
    main()
