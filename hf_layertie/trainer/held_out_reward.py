"""The fixed reward batch of `reward_source="held_out"` and its loss, which rewards the strategy's decisions.

The batch is chosen once (the first `reward_batch_size` held-out examples) and collated once, so that every
decision of a run, and of its resumption, is rewarded on the same examples; its loss is computed in chunks of one
training micro-batch, so that rewarding never raises the memory peak of training.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import torch
from transformers import Trainer

from ..models._compat import prepare_inputs, remove_unused_columns

logger = logging.getLogger(__name__)


def select_reward_examples(dataset, reward_batch_size: int, drop_unused_columns: Callable) -> Sequence:
    """The first `reward_batch_size` examples of `dataset` (the reward dataset, else the eval dataset), the columns
    the model does not take dropped (`drop_unused_columns`, the Trainer's) from a `datasets.Dataset`."""
    if isinstance(dataset, dict):
        raise ValueError("reward_dataset: several eval datasets were given; pass the held-out reward data explicitly")
    if dataset is not None and not hasattr(dataset, "__len__"):
        raise ValueError(
            "reward_source='held_out' takes its fixed reward batch from a dataset with a length, and reward_dataset "
            "(or eval_dataset) is a stream: read its first reward_batch_size examples into memory first "
            "(hf_layertie.toolkit.split_reward_examples does, and skips them in the stream)"
        )
    if dataset is None or len(dataset) == 0:
        raise ValueError(
            "reward_source='held_out' needs held-out data for the reward: pass reward_dataset= (or eval_dataset=), "
            "never the test split"
        )
    count = min(reward_batch_size, len(dataset))
    if hasattr(dataset, "select"):
        return drop_unused_columns(dataset.select(range(count)))
    return [dataset[index] for index in range(count)]


class HeldOutReward:
    """The fixed reward batch, collated on first use, and its loss.

    Args:
        examples: the reward examples (`select_reward_examples`).
        collate: the training data collator.
        batch_size: the examples of one chunk (the training micro-batch's).
        seed: seeds the CPU generator the collation runs under (`agent_seed`).
        prepare_inputs: puts a collated chunk on the model's device.
        step: the optimizer step reached, named in the warning on a non-finite loss.
    """

    def __init__(
        self,
        examples: Sequence,
        collate: Callable[[list], dict],
        batch_size: int,
        seed: int,
        prepare_inputs: Callable[[dict], dict],
        step: Callable[[], int],
    ):
        self._examples = examples
        self._collate = collate
        self._batch_size = batch_size
        self._seed = seed
        self._prepare_inputs = prepare_inputs
        self._step = step
        self._batches: list[tuple[dict, int]] | None = None

    @classmethod
    def of_trainer(cls, trainer: Trainer, reward_dataset) -> HeldOutReward:
        """The reward batch of a Trainer's run: the first examples of `reward_dataset` (else its eval dataset), with
        the columns its model does not take dropped, collated by its data collator in chunks of one training
        micro-batch, put on its device."""
        args = trainer.args
        examples = select_reward_examples(
            reward_dataset if reward_dataset is not None else trainer.eval_dataset,
            args.reward_batch_size,
            lambda dataset: remove_unused_columns(trainer, dataset, description="reward"),
        )
        return cls(
            examples,
            collate=lambda batch: trainer.data_collator(batch),
            batch_size=args.per_device_train_batch_size,
            seed=args.agent_seed,
            prepare_inputs=lambda inputs: prepare_inputs(trainer, inputs),
            step=lambda: trainer.state.global_step,
        )

    @torch.no_grad()
    def loss(self, model: torch.nn.Module) -> float:
        """Loss of the fixed reward batch in eval mode, in chunks of one training micro-batch (so it never raises
        the memory peak), averaged over the chunks by their number of examples."""
        if self._batches is None:
            examples = list(self._examples)
            size = self._batch_size
            # Collate once under a forked CPU RNG: masking collators draw random numbers, and the global RNG must not
            # move. Only the CPU generator is seeded (torch.manual_seed would reseed the accelerators' too, which the
            # fork does not restore: dropout on a GPU would differ between a run and its resumption).
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(self._seed)
                self._batches = [
                    (self._collate(examples[start : start + size]), len(examples[start : start + size]))
                    for start in range(0, len(examples), size)
                ]
        was_training = model.training
        model.eval()
        try:
            total = sum(float(model(**self._prepare_inputs(batch)).loss) * count for batch, count in self._batches)
        finally:
            model.train(was_training)
        value = total / sum(count for _, count in self._batches)
        if not math.isfinite(value):
            logger.warning(f"Held-out loss is {value} at step {self._step()}; the agent will skip this reward")
        return value
