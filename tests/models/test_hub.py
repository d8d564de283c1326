"""Tied checkpoints on the Hub, without network: push and pull through the real client, and cached loads by repo id.

huggingface_hub reads `HF_ENDPOINT`, `HF_HUB_OFFLINE` and `HF_HUB_CACHE` when it is imported, so every client
runs in a subprocess with its own environment. Loads "without the package" run in a process where importing
hf_layertie raises, so the checkpoint can only have used the code stored next to it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.hub_server import HubServer, hub_server  # noqa: F401  (the fixture)
from helpers.models import EVERY_KIND, LLAMA, make_tiny_gpt2_config
from helpers.remote_code import REFUSE_HF_LAYERTIE
from safetensors.torch import load_file, save_file

from hf_layertie import TiedGPT2LMHeadModel
from hf_layertie.model_card import write_model_card

# The fast tier (`python -m pytest -m "not e2e and not slow"`) leaves these out: pushes, pulls and loads in fresh processes.
pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
INPUT_IDS = torch.tensor([[5, 17, 42, 8, 99, 3, 61, 27]])

# Loads a model by repo id, saves its logits on `inputs.safetensors` and reports which code it ran and which
# blocks hold the very same Parameter objects (entry i = first block sharing all of block i's Parameters).
LOAD_AND_REPORT = """
import json
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

workdir = Path(sys.argv[1])


def load_and_report(name, auto_class, repo_id, blocks_path, **kwargs):
    model = getattr(transformers, auto_class).from_pretrained(repo_id, **kwargs).eval()
    blocks = [tuple(map(id, block.parameters())) for block in model.get_submodule(blocks_path)]
    with torch.no_grad():
        logits = model(load_file(workdir / "inputs.safetensors")["input_ids"]).logits
    save_file({"logits": logits.contiguous()}, workdir / f"{name}.safetensors")
    report = {"module": type(model).__module__, "tying_map": [blocks.index(ids) for ids in blocks]}
    (workdir / f"{name}.json").write_text(json.dumps(report))
"""

PUSH = """
import sys
from pathlib import Path

import hf_layertie  # noqa: F401
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM

checkpoint, repo_id = Path(sys.argv[1]), sys.argv[2]
AutoModelForCausalLM.from_pretrained(checkpoint).push_to_hub(repo_id)
ModelCard.load(checkpoint / "README.md").push_to_hub(repo_id)
"""

PULL_WITHOUT_PACKAGE = (
    REFUSE_HF_LAYERTIE
    + LOAD_AND_REPORT
    + """
import shutil

from huggingface_hub import hf_hub_download

repo_id = sys.argv[2]
load_and_report("pulled", "AutoModelForCausalLM", repo_id, "transformer.h", trust_remote_code=True)
for filename in ("README.md", "config.json"):
    shutil.copyfile(hf_hub_download(repo_id, filename), workdir / f"pulled_{filename}")
"""
)

# First without the package (the meta path hook refuses it), then with it, in the same process.
LOAD_CACHED = (
    REFUSE_HF_LAYERTIE
    + LOAD_AND_REPORT
    + """
checkpoints = json.loads(sys.argv[2])
for repo_id, (auto_class, blocks_path) in checkpoints.items():
    name = repo_id.replace("/", "--")
    load_and_report(f"{name}-remote-code", auto_class, repo_id, blocks_path, trust_remote_code=True)
assert not any(module.split(".")[0] == "hf_layertie" for module in sys.modules)

sys.meta_path.pop(0)
import hf_layertie  # noqa: E402,F401

for repo_id, (auto_class, blocks_path) in checkpoints.items():
    name = repo_id.replace("/", "--")
    load_and_report(f"{name}-package", auto_class, repo_id, blocks_path)
"""
)


def run_python(code: str, *args, env: dict[str, str], cwd: Path) -> None:
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"subprocess failed with exit code {result.returncode}:\n{result.stderr[-5000:]}"


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(INPUT_IDS).logits


def assert_loaded_like(workdir: Path, name: str, model, module_prefix: str, tying_map=None) -> None:
    """The load `name` ran code from `module_prefix`, shared blocks as `tying_map` (the model's) and gave its logits."""
    report = json.loads((workdir / f"{name}.json").read_text())
    assert report["module"].startswith(module_prefix), report["module"]
    assert report["tying_map"] == (tying_map if tying_map is not None else model.tying_map.to_list())
    torch.testing.assert_close(load_file(workdir / f"{name}.safetensors")["logits"], logits_of(model), rtol=0, atol=0)


def lay_out_hub_cache(checkpoint: Path, cache: Path, repo_id: str, revision: str) -> None:
    """The layout `hf_hub_download` writes: `models--org--name/refs/main` names a snapshot holding the files."""
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_folder / "refs").mkdir(parents=True)
    (repo_folder / "refs" / "main").write_text(revision)
    shutil.copytree(checkpoint, repo_folder / "snapshots" / revision)


HUB_CLIENT_CHECKS = """
import json
import sys
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
)

folder, report = Path(sys.argv[1]), {}
api = HfApi()
api.create_repo("org/files")
api.create_repo("org/files", exist_ok=True)
try:
    api.create_repo("org/files")
except HfHubHTTPError as error:
    report["create_twice"] = error.response.status_code
first = api.upload_folder(repo_id="org/files", folder_path=folder).oid
second = api.upload_file(path_or_fileobj=b"second", path_in_repo="a.txt", repo_id="org/files").oid
report["files"] = api.list_repo_files("org/files")
report["head_is_second_commit"] = api.model_info("org/files").sha == second
report["a_now"] = Path(hf_hub_download("org/files", "a.txt")).read_text()
report["a_first"] = Path(hf_hub_download("org/files", "a.txt", revision=first)).read_text()
snapshot = Path(snapshot_download("org/files"))
report["snapshot"] = sorted(str(path.relative_to(snapshot)) for path in snapshot.rglob("*") if path.is_file())
report["top_level"] = [(type(entry).__name__, entry.path) for entry in api.list_repo_tree("org/files")]
report["in_sub"] = [entry.path for entry in api.list_repo_tree("org/files", path_in_repo="sub")]
try:
    api.upload_file(path_or_fileobj=b"late", path_in_repo="a.txt", repo_id="org/files", parent_commit=first)
except HfHubHTTPError as error:
    report["stale_parent"] = error.response.status_code
api.delete_file("a.txt", repo_id="org/files")
api.delete_folder("sub", repo_id="org/files")
report["after_deletes"] = api.list_repo_files("org/files")
for name, call in {
    "missing_repo": lambda: hf_hub_download("org/missing", "a.txt"),
    "missing_file": lambda: hf_hub_download("org/files", "missing.txt"),
    "missing_revision": lambda: hf_hub_download("org/files", "a.txt", revision="no-such-branch"),
    "bad_card": lambda: ModelCard("---\\nmodel-index: 3\\n---\\n# Card").validate(),
}.items():
    try:
        call()
    except (RepositoryNotFoundError, RemoteEntryNotFoundError, RevisionNotFoundError, ValueError) as error:
        report[name] = type(error).__name__
(folder.parent / "report.json").write_text(json.dumps(report))
"""


def test_the_test_hub_serves_the_real_client(hub_server: HubServer, tmp_path):  # noqa: F811
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("first")
    (folder / "sub" / "b.bin").write_bytes(bytes(range(256)))

    run_python(HUB_CLIENT_CHECKS, folder, env=hub_server.client_env(tmp_path / "home"), cwd=tmp_path)

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["create_twice"] == 409
    assert sorted(report["files"]) == ["a.txt", "sub/b.bin"]
    assert report["head_is_second_commit"]
    assert (report["a_now"], report["a_first"]) == ("second", "first")
    assert report["snapshot"] == ["a.txt", "sub/b.bin"]
    assert report["top_level"] == [["RepoFile", "a.txt"], ["RepoFolder", "sub"]]
    assert report["in_sub"] == ["sub/b.bin"]
    assert report["stale_parent"] == 412
    assert report["after_deletes"] == []
    assert report["missing_repo"] == "RepositoryNotFoundError"
    assert report["missing_file"] == "RemoteEntryNotFoundError"
    assert report["missing_revision"] == "RevisionNotFoundError"
    assert report["bad_card"] == "ValueError"
    assert hub_server.unhandled == []


@pytest.mark.slow
def test_push_to_hub_then_load_by_repo_id_without_the_package(hub_server: HubServer, tmp_path):  # noqa: F811
    repo_id = "org/tiny-tied"
    model = TiedGPT2LMHeadModel(make_tiny_gpt2_config([0, 0, 2, 0, 2]))
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    card_path = write_model_card(model, checkpoint, dataset_names=["wikitext"], model_name=repo_id)
    save_file({"input_ids": INPUT_IDS}, tmp_path / "inputs.safetensors")

    run_python(PUSH, checkpoint, repo_id, env=hub_server.client_env(tmp_path / "pusher"), cwd=tmp_path)
    run_python(PULL_WITHOUT_PACKAGE, tmp_path, repo_id, env=hub_server.client_env(tmp_path / "puller"), cwd=tmp_path)

    assert_loaded_like(tmp_path, "pulled", model, module_prefix="transformers_modules.org.")
    assert (tmp_path / "pulled_README.md").read_text() == card_path.read_text()
    assert json.loads((tmp_path / "pulled_config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_tied_gpt2.TiedGPT2Config",
        "AutoModelForCausalLM": "modeling_tied_gpt2.TiedGPT2LMHeadModel",
    }
    assert hub_server.unhandled == []


@pytest.mark.slow
def test_a_hand_made_cache_loads_by_repo_id_offline_with_and_without_the_package(tmp_path):
    """Every tied class, one of them saved with a skipped position (`config.skipped_positions`, which the remote
    code must honour as the package does)."""
    models = {f"org/tied-{kind.name}": (kind.tied_model([0, 1, 1, 0]), kind.auto_class.__name__) for kind in EVERY_KIND}
    models["org/tied-llama-skipping"] = (LLAMA.tied_model([0, 1, 1, 0], skipped_positions=[2]), LLAMA.auto_class.__name__)
    cache = tmp_path / "hub-cache"
    for index, (repo_id, (model, _)) in enumerate(models.items()):
        checkpoint = tmp_path / repo_id
        model.save_pretrained(checkpoint)
        lay_out_hub_cache(checkpoint, cache, repo_id, revision=f"{index:040x}")
    save_file({"input_ids": INPUT_IDS}, tmp_path / "inputs.safetensors")
    checkpoints = {repo_id: (auto_class, model.tied_blocks_path) for repo_id, (model, auto_class) in models.items()}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(cache)}

    run_python(LOAD_CACHED, tmp_path, json.dumps(checkpoints), env=env, cwd=tmp_path)

    for repo_id, (model, _) in models.items():
        name = repo_id.replace("/", "--")
        assert_loaded_like(tmp_path, f"{name}-remote-code", model, module_prefix="transformers_modules.")
        assert_loaded_like(tmp_path, f"{name}-package", model, module_prefix="hf_layertie.")


# Loads plain checkpoints with stock transformers only: no hf_layertie, no remote code.
LOAD_UNTIED = (
    REFUSE_HF_LAYERTIE
    + LOAD_AND_REPORT
    + """
for name, (auto_class, blocks_path) in json.loads(sys.argv[2]).items():
    load_and_report(name, auto_class, str(workdir / name), blocks_path)
assert not any(module.split(".")[0] == "hf_layertie" for module in sys.modules)
"""
)


@pytest.mark.slow
def test_to_untied_checkpoints_load_with_stock_transformers_and_the_same_logits_without_the_package(tmp_path):
    models = {kind.name: kind.tied_model([0, 0, 2, 0, 2]) for kind in EVERY_KIND}
    for name, model in models.items():
        model.to_untied().save_pretrained(tmp_path / name)
    save_file({"input_ids": INPUT_IDS}, tmp_path / "inputs.safetensors")
    checkpoints = {kind.name: (kind.auto_class.__name__, kind.blocks_path) for kind in EVERY_KIND}

    run_python(LOAD_UNTIED, tmp_path, json.dumps(checkpoints), env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)

    for kind in EVERY_KIND:
        assert_loaded_like(
            tmp_path, kind.name, models[kind.name], f"transformers.models.{kind.name}.", tying_map=[0, 1, 2, 3, 4]
        )


PUSH_CHECKPOINTS = """
import json
import os
import sys

import datasets
import torch

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel, TyingTrainer, TyingTrainingArguments

output_dir, repo_id = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = TiedGPT2LMHeadModel(TiedGPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, n_positions=16))
ids = torch.randint(0, 100, (32, 16), generator=torch.Generator().manual_seed(1)).tolist()
args = TyingTrainingArguments(
    output_dir=output_dir, tying_strategy="static:cycle:2", max_steps=4, per_device_train_batch_size=4, use_cpu=True,
    report_to=[], save_strategy="steps", save_steps=2, push_to_hub=True, hub_model_id=repo_id,
    hub_strategy="checkpoint", disable_tqdm=True,
)
trainer = TyingTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": ids, "labels": ids}))
push, complete_when_pushed = trainer._push_from_checkpoint, []


def recording_push(folder):  # the upload runs in the background: what it may read is what the folder holds now
    complete_when_pushed.append(os.path.isfile(os.path.join(folder, "tying_state.pt")))
    push(folder)


trainer._push_from_checkpoint = recording_push
trainer.train()
push_folder = trainer.push_to_hub


def recording_folder_push(*args, **kwargs):
    complete_when_pushed.append(os.path.isfile(os.path.join(output_dir, "tying_state.pt")))
    return push_folder(*args, **kwargs)


trainer.push_to_hub = recording_folder_push
trainer.save_model()
trainer._finish_current_push()
with open(os.path.join(output_dir, "complete_when_pushed.json"), "w") as file:
    json.dump(complete_when_pushed, file)
"""


@pytest.mark.slow
def test_a_checkpoint_or_final_model_pushed_holds_its_tying_state(hub_server: HubServer, tmp_path):  # noqa: F811
    """With hub_strategy="checkpoint" the Trainer pushes each checkpoint as `last-checkpoint/`, and the final save
    the output folder; each must be complete (its tying state written), or a resume from it is refused."""
    repo_id = "org/tied-run"
    run_python(PUSH_CHECKPOINTS, tmp_path / "run", repo_id, env=hub_server.client_env(tmp_path / "home"), cwd=tmp_path)
    # the checkpoints of steps 2 and 4, then the final save
    assert json.loads((tmp_path / "run" / "complete_when_pushed.json").read_text()) == [True, True, True]
    _, files = hub_server.hub.files(repo_id, "main")
    assert "last-checkpoint/tying_state.pt" in files and "last-checkpoint/trainer_state.json" in files
    assert {"tying_state.pt", "model.safetensors", "README.md"} <= set(files)
    assert hub_server.unhandled == []


PUSH_LAMBADA = """
import sys

import torch

from hf_layertie import TiedGPT2Config, TiedGPT2LMHeadModel
from hf_layertie.lambada.run import run_lambada
from hf_layertie.toolkit import load_tokenizer

checkpoint, lambada_file, output_dir, repo_id = sys.argv[1:5]
tokenizer = load_tokenizer("gpt2")
torch.manual_seed(0)
config = TiedGPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=256, tying_map=[0, 0])
TiedGPT2LMHeadModel(config).save_pretrained(checkpoint)
tokenizer.save_pretrained(checkpoint)
run_lambada([
    "--model_name_or_path", checkpoint, "--lambada_file", lambada_file, "--do_eval", "--max_eval_passages", "4",
    "--output_dir", output_dir, "--report_to", "none", "--push_to_hub", "--hub_model_id", repo_id,
])
"""


@pytest.mark.slow
def test_run_lambada_pushes_the_scored_model_and_its_card(hub_server: HubServer, tmp_path):  # noqa: F811
    from hf_layertie.data import LAMBADA_TEST_FILE

    lambada = tmp_path / "lambada.jsonl"
    lambada.write_text("\n".join(LAMBADA_TEST_FILE.read_text(encoding="utf-8").splitlines()[:4]) + "\n")
    repo_id = "org/tied-lambada"
    run_python(
        PUSH_LAMBADA, tmp_path / "checkpoint", lambada, tmp_path / "out", repo_id,
        env=hub_server.client_env(tmp_path / "home"), cwd=tmp_path,
    )  # fmt: skip
    _, files = hub_server.hub.files(repo_id, "main")
    assert {"model.safetensors", "config.json", "README.md"} <= set(files)
    card = hub_server.hub.blob_path(files["README.md"]).read_text()
    assert "lambada_accuracy" in card and card == (tmp_path / "out" / "README.md").read_text()  # the scores kept
    assert hub_server.unhandled == []
