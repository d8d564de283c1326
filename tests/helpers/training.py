"""A tiny TiedGPT2 and its trainer on random tokens (`make_trainer`), an optimizer check, and distillation's student:
shared by the trainer's, the engine's, the conversion, relaxed-ties and CUDA tests."""

import datasets
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from helpers.models import make_tiny_gpt2_config
from hf_layertie import TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments


def tiny_model(num_blocks=4, seed=0):
    torch.manual_seed(seed)
    return TiedGPT2LMHeadModel(make_tiny_gpt2_config(num_blocks=num_blocks, n_embd=32))


def token_dataset(rows=64, length=16, seed=1):
    ids = torch.randint(0, 100, (rows, length), generator=torch.Generator().manual_seed(seed)).tolist()
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def tying_args(output_dir, **overrides):
    """Arguments of a short test run; `dlt` and `random` decide every 2 steps unless told otherwise."""
    dynamic = overrides.get("tying_strategy", "dlt") in ("dlt", "random")
    settings = dict(
        output_dir=str(output_dir),
        max_steps=24,
        **({"tying_interval": 2} if dynamic else {}),
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=4,
        seed=0,
    )
    return TyingTrainingArguments(**{**settings, **overrides})


def make_trainer(output_dir, model=None, callbacks=(), model_card_kwargs=None, **overrides):
    data = token_dataset()
    return TyingTrainer(
        model=model if model is not None else tiny_model(),
        args=tying_args(output_dir, **overrides),
        train_dataset=data,
        eval_dataset=data.select(range(8)),
        callbacks=list(callbacks),
        model_card_kwargs=model_card_kwargs,
    )


def torch_optimizer(trainer):
    return getattr(trainer.optimizer, "optimizer", trainer.optimizer)


class OptimizerMatchesModel(TrainerCallback):
    """Before every optimizer step (so after every re-tie): groups hold exactly the distinct trainable
    Parameters and no state is left for a vanished one; after it: every Parameter has state."""

    def __init__(self):
        self.trainer = None
        self.checked_steps = 0

    def _distinct_trainable(self):
        return {id(parameter) for parameter in self.trainer.model.parameters() if parameter.requires_grad}

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        optimizer = torch_optimizer(self.trainer)
        in_groups = [id(parameter) for group in optimizer.param_groups for parameter in group["params"]]
        assert len(in_groups) == len(set(in_groups)), "a Parameter appears twice in the optimizer"
        assert set(in_groups) == self._distinct_trainable(), f"optimizer groups differ from the model at step {state.global_step}"
        assert {id(parameter) for parameter in optimizer.state} <= set(in_groups), "state left for a vanished Parameter"

    def on_step_end(self, args, state, control, **kwargs):
        optimizer = torch_optimizer(self.trainer)
        assert {id(parameter) for parameter in optimizer.state} == self._distinct_trainable()
        self.checked_steps += 1


def assert_resuming_equals_the_uninterrupted_run(tmp_path, settings: dict, resume_step: int, trained: bool = False) -> None:
    """Train `settings` whole into tmp_path/whole (unless `trained` there already), train them again from checkpoint
    `resume_step`: the final weights are equal."""
    if not trained:
        make_trainer(tmp_path / "whole", **settings).train()
    resumed = make_trainer(tmp_path / "resumed", **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{resume_step}"))
    whole = load_file(tmp_path / "whole" / f"checkpoint-{settings['max_steps']}" / "model.safetensors")
    again = resumed.model.state_dict()
    assert all(torch.equal(again[name], tensor) for name, tensor in whole.items())


# Distillation's student, and its loss written out.


def student_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return TiedGPT2LMHeadModel(make_tiny_gpt2_config(num_blocks=4, n_embd=32, **overrides))


def without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def mix_by_hand(student_logits, teacher_logits, labels, temperature, alpha):
    """The loss of Hinton et al. written out, over the scored positions (shifted, not -100); and the CE alone."""
    targets = labels[:, 1:]
    scored = targets != -100
    s, t = student_logits[:, :-1][scored].double(), teacher_logits[:, :-1][scored].double()
    cross_entropy = -torch.log_softmax(s, -1).gather(1, targets[scored][:, None]).mean()
    p_teacher = torch.softmax(t / temperature, -1)
    kl = (p_teacher * (torch.log(p_teacher) - torch.log_softmax(s / temperature, -1))).sum(-1).mean()
    return ((1 - alpha) * cross_entropy + alpha * temperature**2 * kl).item(), cross_entropy.item()
