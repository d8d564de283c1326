"""Regenerate `example_tied_gpt2.md` (and `tying_map.png`): a tiny GPT-2 trained with Dynamic Layer Tying.

Run from the repository root, with the shared data folder beside it:

    python model_cards/make_example_card.py

Trains 60 steps on the WikiText-2 validation split, evaluates on the first blocks of the test split (the
train split is not available offline) and writes the card with `hf_layertie.model_card.write_model_card`.
A few minutes on a laptop CPU; the numbers in the card are whatever this run measures.
"""

import math
import shutil
import tempfile
from pathlib import Path

from datasets import Dataset
from transformers import GPT2TokenizerFast, default_data_collator

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments
from hf_layertie.model_card import write_model_card

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"
BLOCK_SIZE = 64


def token_blocks(path: Path, tokenizer, max_blocks: int) -> Dataset:
    ids = tokenizer(path.read_text(encoding="utf-8"))["input_ids"]
    blocks = [ids[start : start + BLOCK_SIZE] for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE)]
    blocks = blocks[:max_blocks]
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


def main() -> None:
    tokenizer = GPT2TokenizerFast.from_pretrained(DATA / "tokenizers" / "gpt2")
    train = token_blocks(DATA / "wikitext-2" / "valid.txt", tokenizer, max_blocks=480 + 16)
    train, reward = train.select(range(480)), train.select(range(480, 496))
    test = token_blocks(DATA / "wikitext-2" / "test.txt", tokenizer, max_blocks=64)
    config = TiedGPT2Config(
        n_layer=6, n_embd=64, n_head=4, n_positions=BLOCK_SIZE, vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = TiedGPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as output_dir:
        args = TyingTrainingArguments(
            output_dir=output_dir,
            max_steps=60,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=16,
            learning_rate=1e-3,
            seed=0,
            tying_interval=5,
            reward_batch_size=16,
            report_to=[],
            save_strategy="no",
        )
        trainer = TyingTrainer(
            model=model, args=args, train_dataset=train, reward_dataset=reward, data_collator=default_data_collator
        )
        trainer.train()
        trainer.save_model(output_dir)
        metrics = trainer.evaluate(test)
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        card = write_model_card(
            model,
            output_dir,
            training_args=args,
            eval_results={"wikitext": metrics},
            dataset_names=["wikitext"],
            tying_plot=Path(output_dir) / "tying_map.png",
            model_name="example-tied-gpt2",
        )
        shutil.copyfile(card, HERE / "example_tied_gpt2.md")
        shutil.copyfile(Path(output_dir) / "tying_map.png", HERE / "tying_map.png")


if __name__ == "__main__":
    main()
