"""The guard on private transformers APIs (`hf_layertie/models/_compat.py`): one clear error for a transformers outside
the supported range or without an API the package relies on, at import of the package and of a checkpoint's copied
remote code alike."""

import configparser
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from helpers.models import GPT2
from helpers.remote_code import REFUSE_HF_LAYERTIE
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from transformers import PreTrainedModel, Trainer

from hf_layertie.models import _compat

REPO_ROOT = Path(__file__).resolve().parents[2]


def install_requirement(name: str) -> Requirement:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].strip().splitlines()
    return next(requirement for line in lines if (requirement := Requirement(line.strip())).name == name)


def run_python(code: str, *args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_the_supported_range_is_the_one_setup_cfg_installs():
    assert install_requirement("transformers").specifier == SpecifierSet(_compat.SUPPORTED_TRANSFORMERS)


def test_the_installed_transformers_is_supported():
    _compat.check_transformers_version()
    _compat.check_pretrained_model_private_api()
    _compat.check_trainer_private_api(Trainer)


def fake_installed_transformers(monkeypatch, installed: str) -> None:
    """Make the version the compat module reads (the installed distribution's) `installed`."""
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: installed if name == "transformers" else real(name))


@pytest.mark.parametrize("installed", ["5.18.0", "5.23.0.dev0", "5.99.1"])
def test_versions_in_the_range_pass(monkeypatch, installed):
    fake_installed_transformers(monkeypatch, installed)
    _compat.check_transformers_version()


@pytest.mark.parametrize("installed", ["4.57.1", "5.17.2", "5.18.0.dev0", "6.0.0.dev0", "6.0.0"])
def test_a_version_outside_the_range_names_the_installed_and_supported_versions(monkeypatch, installed):
    fake_installed_transformers(monkeypatch, installed)
    with pytest.raises(ImportError) as raised:
        _compat.check_transformers_version()
    assert f"transformers {installed} is installed" in str(raised.value)
    assert "transformers>=5.18,<6" in str(raised.value)


def test_a_renamed_private_api_is_named(monkeypatch):
    monkeypatch.delattr(PreTrainedModel, "_adjust_bias")
    with pytest.raises(ImportError, match=r"has no PreTrainedModel\._adjust_bias, which hf-layertie's tied models"):
        _compat.check_pretrained_model_private_api()
    trainer_without = type("Trainer", (), {name: None for name in list(_compat.TRAINER_PRIVATE_API)[:-1]})
    with pytest.raises(ImportError, match=r"has no Trainer\._push_from_checkpoint, which hf-layertie's TyingTrainer"):
        _compat.check_trainer_private_api(trainer_without)


def test_tie_weights_without_the_arguments_passed_on_is_named(monkeypatch):
    monkeypatch.setattr(PreTrainedModel, "tie_weights", lambda self: None)
    with pytest.raises(ImportError, match=r"tie_weights takes no 'missing_keys'"):
        _compat.check_pretrained_model_private_api()


# The installed transformers' version faked in a fresh process, before anything imports the compat module.
FAKE_VERSION = """
import sys
from importlib import metadata

real_version = metadata.version
metadata.version = lambda name: sys.argv[-1] if name == "transformers" else real_version(name)
"""


def test_importing_the_package_under_an_unsupported_transformers_raises_that_error():
    completed = run_python(FAKE_VERSION + "import hf_layertie\n", "6.0.0")
    assert completed.returncode != 0
    expected = "ImportError: hf-layertie's tied models support transformers>=5.18,<6, but transformers 6.0.0 is installed"
    assert expected in completed.stderr, completed.stderr[-3000:]


LOAD_WITHOUT_PACKAGE = REFUSE_HF_LAYERTIE + """
import transformers

model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
print(type(model).__module__, model.config.tying_map)
"""


def test_a_checkpoint_s_remote_code_checks_the_loader_s_transformers(tmp_path):
    model = GPT2.tied_model([0, 0, 2, 2])
    model.save_pretrained(tmp_path / "checkpoint")
    copied = {path.name for path in (tmp_path / "checkpoint").iterdir()}
    assert {"_compat.py", "adapter_export.py", "tied_blocks.py", "configuration_tying.py"} <= copied
    env = {"HF_MODULES_CACHE": str(tmp_path / "modules")}

    loaded = run_python(LOAD_WITHOUT_PACKAGE, tmp_path / "checkpoint", env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split()[0].startswith("transformers_modules.") and "[0, 0, 2, 2]" in loaded.stdout

    refused = run_python(FAKE_VERSION + LOAD_WITHOUT_PACKAGE, tmp_path / "checkpoint", "5.17.0", env=env)
    assert refused.returncode != 0
    expected = "support transformers>=5.18,<6, but transformers 5.17.0 is installed"
    assert expected in refused.stderr, refused.stderr[-3000:]


LOAD_WITH_A_FOREIGN_CONFIG = """
import sys
import torch
from transformers.dynamic_module_utils import get_class_from_dynamic_module
import hf_layertie

path = sys.argv[1]
foreign = get_class_from_dynamic_module("configuration_tied_gpt2.TiedGPT2Config", path)
config = foreign.from_pretrained(path)
config.tying_map = [0, 1, 2, 3]
assert type(config) is not hf_layertie.TiedGPT2Config
by_config = hf_layertie.TiedGPT2LMHeadModel.from_pretrained(path, config=config)
by_argument = hf_layertie.TiedGPT2LMHeadModel.from_pretrained(path, tying_map=[0, 1, 2, 3])
ids = torch.arange(8)[None]
print(torch.equal(by_config(ids).logits, by_argument(ids).logits))
"""


def test_a_config_class_remote_code_loaded_regroups_a_checkpoint_as_the_package_s_own_does(tmp_path):
    """The config class of a checkpoint's remote code is another class than the package's (another copy of its
    module): given to `from_pretrained` with another map, it regroups the checkpoint's blocks all the same, rather
    than leaving the blocks it stores as ties to a fresh initialisation."""
    model = GPT2.tied_model([0, 0, 2, 2])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    model.save_pretrained(tmp_path / "checkpoint")
    loaded = run_python(LOAD_WITH_A_FOREIGN_CONFIG, tmp_path / "checkpoint", env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split()[-1] == "True"

