"""On a CUDA GPU: every strategy trains there with the optimizer in step and every tensor on the device, block
similarity measures there what it measures on the CPU, and a trained model reloads with equal logits. Skipped on a
machine without one (CI); run them where one is lent (`python -m pytest tests/test_cuda.py`)."""

import datasets
import pytest
import torch
from helpers.models import perturb_
from helpers.training import OptimizerMatchesModel, make_trainer, tiny_model, token_dataset, torch_optimizer, tying_args

from hf_layertie import TyingTrainer
from hf_layertie.block_similarity import block_angular_distances

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("strategy", ["dlt", "random", "similarity:2", "static:cycle:2", "none"])
def test_every_strategy_trains_on_the_gpu_with_the_optimizer_in_step(tmp_path, strategy):
    warmup = {"similarity_warmup_steps": 2} if strategy.startswith("similarity") else {}
    check = OptimizerMatchesModel()
    trainer = make_trainer(tmp_path, callbacks=[check], tying_strategy=strategy, use_cpu=False, max_steps=12, **warmup)
    check.trainer = trainer
    trainer.train()

    assert check.checked_steps == 12
    assert {parameter.device.type for parameter in trainer.model.parameters()} == {"cuda"}
    states = [value for state in torch_optimizer(trainer).state.values() for value in state.values() if torch.is_tensor(value) and value.dim()]
    assert states and {value.device.type for value in states} == {"cuda"}


def test_block_similarity_on_the_gpu_equals_the_cpu():
    model = tiny_model(num_blocks=4)
    perturb_(model, seed=2)
    ids = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    on_cpu = block_angular_distances(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    on_gpu = block_angular_distances(model.cuda(), {"input_ids": ids.cuda(), "attention_mask": torch.ones_like(ids).cuda()})
    assert on_gpu == pytest.approx(on_cpu, abs=1e-4)


def test_a_model_trained_on_the_gpu_reloads_with_equal_logits(tmp_path):
    trainer = make_trainer(tmp_path / "run", use_cpu=False, max_steps=12)
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    reloaded = type(trainer.model).from_pretrained(tmp_path / "saved").cuda().eval()
    ids = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, trainer.model.eval()(ids).logits)
    assert reloaded.tying_map == trainer.model.tying_map


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_distilled_run_keeps_its_teacher_on_the_students_device_and_dtype(tmp_path, dtype):
    """A float32 teacher checkpoint runs on the GPU in the student's dtype, frozen, and the training loss is the
    mix computed by hand there."""
    from helpers.training import mix_by_hand, student_model, without_dropout

    student_model(seed=5).save_pretrained(tmp_path / "teacher")
    ids = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = tying_args(
        tmp_path / "run", tying_strategy="static:cycle:2", use_cpu=False, max_steps=1, learning_rate=0.0,
        distill_from=str(tmp_path / "teacher"),
    )  # fmt: skip
    trainer = TyingTrainer(model=without_dropout(student_model()).to(dtype), args=args, train_dataset=data)
    teacher = trainer.distillation.teacher
    assert {(parameter.device.type, parameter.dtype) for parameter in teacher.parameters()} == {("cuda", dtype)}
    train_loss = trainer.train().training_loss
    with torch.no_grad():
        logits = [model.eval()(input_ids=ids.cuda()).logits.cpu() for model in (trainer.model, teacher)]
    mix, _ = mix_by_hand(*logits, ids, temperature=2.0, alpha=5 / 7)
    assert train_loss == pytest.approx(mix, rel=1e-5 if dtype == torch.float32 else 1e-2)
    assert not any(parameter.requires_grad for parameter in teacher.parameters())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs in one process")
def test_distillation_under_data_parallel_is_refused_naming_the_launch_to_use(tmp_path):
    """With several GPUs and no launcher, the Trainer wraps the model in DataParallel and would count the mix once
    per GPU: refused before the teacher is loaded."""
    from helpers.training import student_model

    student_model(seed=5).save_pretrained(tmp_path / "teacher")
    args = tying_args(tmp_path / "run", tying_strategy="static:cycle:2", use_cpu=False, distill_from=str(tmp_path / "teacher"))
    with pytest.raises(ValueError, match=r"distill_from under torch.nn.DataParallel .*Launch one process per GPU"):
        TyingTrainer(model=student_model(), args=args, train_dataset=token_dataset())


def test_a_teacher_follows_a_student_the_trainer_places_on_the_gpu_only_when_training_starts(tmp_path):
    """With bf16_full_eval the Trainer leaves the student on the CPU until `train`, where the teacher was loaded
    beside it: the teacher must score each batch on the batch's device."""
    from helpers.training import student_model

    teacher = tmp_path / "teacher"
    student_model(seed=5).save_pretrained(teacher)
    args = tying_args(tmp_path / "run", tying_strategy="static:cycle:2", max_steps=4, use_cpu=False, bf16_full_eval=True, distill_from=str(teacher))
    trainer = TyingTrainer(model=student_model(), args=args, train_dataset=token_dataset())
    assert trainer.distillation.teacher.device.type == "cpu"  # where the student was when the trainer was built
    assert trainer.train().global_step == 4
    assert trainer.distillation.teacher.device.type == "cuda"
