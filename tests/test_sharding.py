"""Tied models under FSDP2 on two gloo processes (CPU, torchrun), against one process training on both batches."""

import os
import re
import subprocess
import sys

import pytest
import torch
from helpers.models import GPT2
from helpers.processes import REPO, run_on_two_ranks

from hf_layertie import TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments
from hf_layertie.sharding import _unsharded_replica, retie_sharded, shard_tied_model

LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("fsdp")
    return output_dir, run_on_two_ranks("fsdp_tying_run.py", output_dir, timeout=600)


def assert_matches_one_process(measured):
    for sharded_loss, expected_loss in measured["losses"]:
        assert abs(sharded_loss - expected_loss) < LOSS_TOLERANCE, measured["losses"]
    assert measured["weights"] < WEIGHT_TOLERANCE


def test_the_replica_of_a_sharded_re_tie_leaves_the_random_generator_alone():
    """A one-process `retie` draws no random number: the sharded one must not either, or dropout would differ."""
    model = GPT2.tied_model([0, 0, 2, 2])
    state = torch.get_rng_state()
    replica = _unsharded_replica(model, type(model), model.state_dict())
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(replica.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("kwargs", [{"use_reentrant": False}, {"use_reentrant": True}])
def test_the_replica_of_a_sharded_re_tie_checkpoints_activations_as_the_model_did(kwargs):
    model = GPT2.tied_model([0, 0, 2, 2])
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # the name every supported transformers has
    replica = _unsharded_replica(model, type(model), model.state_dict())
    assert replica.is_gradient_checkpointing
    for block, source in zip(replica.tied_blocks, model.tied_blocks):
        assert block._gradient_checkpointing_func is source._gradient_checkpointing_func
    assert hasattr(replica, "_require_grads_hook") == hasattr(model, "_require_grads_hook")
    replica.train()
    replica(torch.randint(0, 50, (2, 8)), labels=torch.randint(0, 50, (2, 8))).loss.backward()  # it trains


@pytest.mark.slow
@pytest.mark.parametrize("tying_map", ["[0, 0, 2, 2]", "[0, 1, 0, 1]", "[0, 0, 0, 0]", "[0, 1, 2, 3]", "[0, 1, 0, 0]"])
def test_a_sharded_static_map_trains_as_one_process(fsdp_run, tying_map):
    _, ranks = fsdp_run
    for results in ranks:
        assert_matches_one_process(results["static"][tying_map])


@pytest.mark.slow
def test_a_re_tie_and_a_gather_keep_the_model_s_dtype_and_frozen_parameters(fsdp_run):
    _, ranks = fsdp_run
    for results in ranks:
        assert results["half"] == {"dtypes": ["torch.bfloat16"], "frozen": ["transformer.wte.weight"]}


@pytest.mark.slow
def test_re_ties_of_a_sharded_model_keep_weights_and_optimizer_state_as_one_process(fsdp_run):
    _, (rank0, rank1) = fsdp_run
    assert [step["map"] for step in rank0["reties"]] == [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 3], [0, 0, 2, 0], [0, 1, 2, 3]]
    assert [step["map"] for step in rank1["reties"]] == [step["map"] for step in rank0["reties"]]
    for step in rank0["reties"]:
        assert_matches_one_process(step)


@pytest.mark.slow
def test_retie_on_a_sharded_model_raises_naming_retie_sharded(fsdp_run):
    _, ranks = fsdp_run
    for results in ranks:
        assert "sharded with FSDP2" in results["retie_error"] and "retie_sharded(model, optimizer, new_map)" in results["retie_error"]


@pytest.mark.slow
def test_an_evaluation_shared_out_between_processes_refuses_a_sharded_model(fsdp_run):
    """Each process scores its own batches: FSDP's collective forward would leave them waiting on each other."""
    _, ranks = fsdp_run
    for results in ranks:
        assert results["evaluation_error"].startswith("evaluate_hop_task scores an unsharded model")
        assert "gather_tied_model(model)" in results["evaluation_error"]


@pytest.mark.slow
def test_a_gathered_sharded_model_saves_a_checkpoint_that_loads_with_the_same_logits(fsdp_run):
    output_dir, (rank0, _) = fsdp_run
    loaded = TiedGPT2LMHeadModel.from_pretrained(output_dir / "saved").eval()
    assert loaded.tying_map.to_list() == [0, 1, 2, 3]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=rank0["ids"]).logits, rank0["logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_misuses_of_a_sharded_model_raise_on_every_rank_and_leave_it_usable(tmp_path):
    ranks = run_on_two_ranks("fsdp_refusals_run.py", tmp_path, timeout=120)
    assert ranks[0]["save_on_rank_0"] == (
        "RuntimeError: this FSDPTiedGPT2LMHeadModel is sharded with FSDP2, whose weights save_pretrained cannot write: "
        "save the unsharded copy that hf_layertie.gather_tied_model(model) returns on every process, from one"
    )
    assert not (tmp_path / "saved_on_rank_0").exists() and not (tmp_path / "saved_on_every_rank").exists()
    for results in ranks:
        assert results["save_on_every_rank"] == ranks[0]["save_on_rank_0"]
        assert results["different_maps"] == (
            "ValueError: retie_sharded got different maps on different processes (rank 0 asked for [0, 0, 2, 2], "
            "rank 1 asked for [0, 1, 2, 3]): pass every process the same new_map"
        )
        assert "rank 0 asked for [0, 1, 2, 3], rank 1 asked for [0, 0, 5, 0]" in results["invalid_map_on_rank_1"]
        assert results["optimizer_built_before_sharding"] == (
            "ValueError: retie_sharded's optimizer on rank 0 was built before shard_tied_model, over Parameters that "
            "sharding replaced (its steps change nothing): build it after shard_tied_model, over model.parameters()"
        )
        assert re.fullmatch(
            r"ValueError: retie_sharded's optimizer on rank 0 holds 0 of the model's (\d+) Parameters and \1 of another "
            r"model: pass an optimizer built over model.parameters\(\) after shard_tied_model",
            results["optimizer_of_another_model"],
        )
        assert results["map_after"] == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_collective_called_on_one_rank_alone_names_the_misuse(tmp_path):
    """`gather_tied_model(model)` on rank 0 alone (to save from it) blocked, and `retie_sharded` on one rank ended
    in a bare gloo error: both raise on that rank once the arrival timeout has passed, naming the function."""
    rank_0, _ = run_on_two_ranks("fsdp_one_rank_run.py", tmp_path, timeout=120)
    for function, key in (("gather_tied_model", "gather_on_rank_0"), ("retie_sharded", "retie_on_rank_0")):
        assert rank_0[key].startswith(
            f"RuntimeError: {function} is collective: every process sharing the model must call it at the same step, "
            f"and not every process did within 3 s ("
        ), rank_0[key]


@pytest.mark.parametrize("optimizer_first", [True, False])
def test_an_optimizer_built_before_sharding_is_warned_about_at_the_first_step(caplog, optimizer_first):
    """Its Parameters were replaced by sharding, so it trains nothing; without a re-tie nothing said so. One process
    of gloo, in this process (an in-memory store: no port)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        model = GPT2.tied_model([0, 0, 2, 2])
        early = torch.optim.AdamW(model.parameters()) if optimizer_first else None
        shard_tied_model(model, mesh=init_device_mesh("cpu", (1,)))
        ids = torch.randint(0, 50, (2, 8))
        with caplog.at_level("WARNING", logger="hf_layertie.sharding"):
            model(input_ids=ids)
            model(input_ids=ids)  # once
        warned = [record for record in caplog.records if "still held, most likely by an optimizer built before sharding" in record.message]
        assert len(warned) == (1 if optimizer_first else 0)
        del early
    finally:
        torch.distributed.destroy_process_group()


def test_sharding_an_unsharded_model_only(tmp_path):
    with pytest.raises(ValueError, match="retie_sharded needs a model sharded by hf_layertie.shard_tied_model"):
        retie_sharded(GPT2.tied_model([0, 0]), None, [0, 1])
    with pytest.raises(TypeError, match="shard_tied_model needs a tied model"):
        shard_tied_model(torch.nn.Linear(2, 2))


def test_a_model_with_adapters_is_not_sharded_but_refused_naming_what_works():
    from hf_layertie.relaxed_ties import relax_ties

    model = GPT2.tied_model([0, 0])
    relax_ties(model, 2, "zero")
    with pytest.raises(ValueError, match=r"blocks \[0, 1\] carry PEFT adapters .*DDP \(accelerate launch --multi_gpu\)"):
        shard_tied_model(model)


def test_tying_trainer_refuses_fsdp_naming_what_works(tmp_path):
    args = TyingTrainingArguments(output_dir=str(tmp_path), fsdp=True, use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match=r"TyingTrainer does not train tied models under FSDP.*accelerate launch --multi_gpu.*shard_tied_model"):
        TyingTrainer(model=GPT2.tied_model([0, 0, 2, 2]).train(), args=args)


@pytest.mark.slow
def test_the_fsdp2_loop_example_re_ties_through_the_engine_as_one_process(tmp_path):
    """docs/examples/dlt_fsdp2_loop.py: DLT driven by `TyingEngine` over a sharded model (`ShardedRetie`) on two
    processes ends with the map and the weights of the same loop on one process, unsharded."""
    script = REPO / "docs" / "examples" / "dlt_fsdp2_loop.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    sharded = run_on_two_ranks(script, tmp_path / "two", timeout=300)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "one")], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    one = torch.load(tmp_path / "one" / "rank0.pt")
    for rank in sharded:
        assert rank["maps"] == one["maps"] and rank["decisions"] == one["decisions"]
        assert rank["weights"].keys() == one["weights"].keys()
        assert max(float((rank["weights"][name] - tensor).abs().max()) for name, tensor in one["weights"].items()) < WEIGHT_TOLERANCE  # fmt: skip
    assert len({str(each) for each in one["maps"][1:]}) > 1, one["maps"]  # a decision changed the map mid-run


@pytest.mark.parametrize(
    "settings, refused",
    [
        ({"tying_strategy": "static:0,0,2,2", "lora_rank": 2, "lora_init": "zero"}, "lora_rank=2"),
        ({"tying_strategy": "static:0,0,2,2", "tie_init": "mean"}, "tie_init='mean'"),
        ({"tying_strategy": "dlt", "untie_init": "own"}, "untie_init='own'"),
    ],
)
def test_an_engine_re_tying_a_sharded_model_refuses_what_retie_sharded_cannot_do(tmp_path, settings, refused):
    from hf_layertie.engine import Processes, TyingEngine
    from hf_layertie.sharding import ShardedRetie

    args = TyingTrainingArguments(output_dir=str(tmp_path), max_steps=4, report_to=[], **settings)
    model = GPT2.tied_model([0, 1, 2, 3])
    with pytest.raises(ValueError, match=rf"^{re.escape(refused)} cannot re-tie a model sharded with FSDP2 \("):
        TyingEngine(
            model, args.tying_decisions(4), Processes(), output_dir=str(tmp_path), optimizer=lambda: None,
            refresh_wrapper=lambda: None, held_out_loss=lambda: float("nan"), prepare_inputs=lambda batch: batch,
            steps=lambda: (0, 4), log=print, retie=ShardedRetie(),
        )  # fmt: skip
