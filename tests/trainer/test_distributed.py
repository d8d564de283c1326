"""Two gloo processes on CPU, launched exactly as the README tells users: ranks stay identical through re-ties."""

import json
import sys

import pytest
import torch
from helpers.processes import REPO, launch

from hf_layertie.data.embedded import SHAKESPEARE_DIR

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: several processes train end to end.
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("model_name, loop_lr", [("gpt2", []), ("llama", ["1.0"])])
def test_two_ranks_end_with_identical_maps_and_weights_after_reties_and_an_untie(model_name, loop_lr, tmp_path):
    """The Llama run also trains each block at a rate by its use count (`loop_lr_exponent`): its groups follow the
    re-ties on both ranks alike."""
    launch([str(REPO / "tests" / "scripts" / "ddp_tying_run.py"), str(tmp_path), model_name, *loop_lr], cwd=tmp_path)
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2

    maps = rank0["maps"]
    changes = sum(before != after for before, after in zip([[0, 0, 0, 0]] + maps, maps))
    untied = any(
        before[block] != block and after[block] == block
        for before, after in zip([[0, 0, 0, 0]] + maps, maps)
        for block in range(4)
    )
    assert changes >= 3 and untied, maps
    assert rank0["maps"] == rank1["maps"] and rank0["map"] == rank1["map"]
    assert rank0["state_dict"].keys() == rank1["state_dict"].keys()
    for name, tensor in rank0["state_dict"].items():
        assert torch.equal(tensor, rank1["state_dict"][name]), f"ranks differ in {name}"
    assert rank0["group_uses"] == rank1["group_uses"]
    if loop_lr:
        assert len(rank0["group_uses"]) == 2 * 4  # decay / no decay x use counts 1..4
        assert all(members == [uses] * len(members) for uses, members in rank0["group_uses"])


def test_run_clm_under_accelerate_launch_on_two_processes(tmp_path):
    lines = (SHAKESPEARE_DIR / "macbeth_gut.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.txt").write_text("\n".join(lines[:600]))
    (tmp_path / "validation.txt").write_text("\n".join(lines[2000:2100]))
    completed = launch(
        [
            str(REPO / "run_clm.py"),
            "--train_file", "train.txt", "--validation_file", "validation.txt",
            "--config_overrides", "n_layer=3,n_embd=16,n_head=2,n_positions=32", "--block_size", "32",
            "--output_dir", "out", "--do_train", "--do_eval", "--max_steps", "6", "--tying_interval", "2",
            "--per_device_train_batch_size", "4", "--max_eval_samples", "8",
            "--report_to", "none", "--disable_tqdm", "true", "--log_level", "info",
        ],  # fmt: skip
        cwd=tmp_path,
    )
    assert "Total train batch size (w. parallel, distributed & accumulation) = 8" in completed.stdout + completed.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "README.md").is_file()
    history = (tmp_path / "out" / "tying_history.jsonl").read_text().splitlines()
    assert len(history) == 3  # written once (rank 0), one line per decision
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert results["eval_bigram_loss"] > 0  # the count baseline, counted by the reporting process


def test_a_run_resumed_on_two_ranks_rewards_its_pending_decision_as_the_uninterrupted_run(tmp_path):
    launch([str(REPO / "tests" / "scripts" / "ddp_resume_run.py"), str(tmp_path)], cwd=tmp_path)
    for rank in (0, 1):
        runs = torch.load(tmp_path / f"rank{rank}.pt")
        full, resumed = runs["full"], runs["resumed"]
        assert [row["step"] for row in full["records"]] == [0, 4, 8]
        # The window of the decision of step 4 spans the checkpoint of step 6: its loss must be the same.
        assert full["records"] == resumed["records"], (full["records"], resumed["records"])
        for name, tensor in full["state_dict"].items():
            assert torch.equal(tensor, resumed["state_dict"][name]), f"rank {rank}: {name} differs after resuming"


def test_the_ddp_wrappers_comm_hook_own_hooks_and_settings_survive_reties_on_two_ranks(tmp_path):
    launch([str(REPO / "tests" / "scripts" / "ddp_comm_hook_run.py"), str(tmp_path)], cwd=tmp_path)
    rank0, rank1 = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    assert rank0["world_size"] == rank1["world_size"] == 2
    maps = [tying_map for _, tying_map in rank0["maps"]]
    changes = sum(before != after for before, after in zip([[0, 0, 0, 0]] + maps, maps))
    assert changes >= 3, rank0["maps"]  # each change rebuilt the wrapper
    for rank in (rank0, rank1):
        # A counting comm hook and a forward pre-hook registered on the Trainer's wrapper before the first step ran at
        # every one of the 12 steps, those after each re-tie included.
        assert sorted(set(rank["hook_steps"])) == list(range(12)), (rank["maps"], rank["hook_steps"])
        assert rank["forward_steps"] == list(range(12)), (rank["maps"], rank["forward_steps"])
        # Construction arguments (bucket caps with the small default first bucket, buffer syncing, ...) are unchanged.
        assert rank["settings_end"] == rank["settings_begin"]
        assert rank["settings_end"]["comm_hook"] == "counting_hook"
        # A PowerSGD hook, whose per-bucket memories cannot follow a re-tie, is refused before the first step.
        message, step = rank["refusal"]
        assert "PowerSGD" in message and step == 0
        assert rank["static_steps"] == 4  # under a fixed map (relaxed ties too), nothing is rebuilt: PowerSGD trains
    assert rank0["maps"] == rank1["maps"]
    for name, tensor in rank0["state_dict"].items():
        assert torch.equal(tensor, rank1["state_dict"][name]), f"ranks differ in {name}"


def test_k_hop_and_lambada_scores_on_two_processes_are_one_process_s(tmp_path):
    """Each process scores its share of the batches (not the whole set N times) and every one gets the whole set's
    scores, equal to what one process gets alone."""
    launch([str(REPO / "tests" / "scripts" / "ddp_evaluation_run.py"), str(tmp_path)], cwd=tmp_path)
    sys.path.insert(0, str(REPO / "tests" / "scripts"))
    try:
        from ddp_evaluation_run import evaluation_scores
    finally:
        sys.path.remove(str(REPO / "tests" / "scripts"))
    alone = json.loads(json.dumps(evaluation_scores()))  # hop counts as JSON keys
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # 11 k-hop examples and 7 passages in batches of 3: 4 + 3 batches in all, shared out, none scored twice.
    assert [launched.pop("forward_passes") for launched in ranks] == [4, 3]
    for launched in [*ranks, alone]:  # flat, as pytest.approx compares them
        launched["k-hop"] |= {f"hops {hop}": value for hop, value in launched["k-hop"].pop("accuracy_by_hops").items()}
    for launched in ranks:
        assert launched["lambada"] == pytest.approx(alone["lambada"]) and launched["lambada"]["lambada_examples"] == 7
        assert launched["k-hop"] == pytest.approx(alone["k-hop"])
