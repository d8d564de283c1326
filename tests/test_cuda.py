"""On a CUDA GPU: every strategy trains there with the optimizer in step and every tensor on the device, block
similarity measures there what it measures on the CPU, and a trained model reloads with equal logits. Skipped on a
machine without one (CI); run them where one is lent (`python -m pytest tests/test_cuda.py`)."""

import pytest
import torch
from test_tied_models import perturb_
from test_tying_trainer import OptimizerMatchesModel, make_trainer, tiny_model, torch_optimizer

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
