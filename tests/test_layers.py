"""The package's layers (hf_layertie/README.md): each folder imports only from the layers its row allows."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_layertie"
LEAVES = {"models", "checks", "model_card", "data", "metrics"}
ALLOWED = {
    **dict.fromkeys(LEAVES, set()),
    "block_similarity": {"models", "checks"},
    "relaxed_ties": {"models", "checks"},
    "sharding": {"models"},
    "serving": {"models"},
    "dlt": {"models", "checks"},
    "decisions": {"dlt", "block_similarity", "relaxed_ties", "models", "checks"},
    "engine": {"decisions", "dlt", "block_similarity", "relaxed_ties", "models"},
    "trainer": {"engine", "decisions", "dlt", "block_similarity", "relaxed_ties", "models", "model_card", "checks"},
    "toolkit": {"trainer", "models", "data", "checks"},
    "language_modeling": {"toolkit", "trainer", "serving", "models", "data", "metrics", "checks"},
    "lambada": {"toolkit", "trainer", "models", "data", "metrics"},
}


def package_imports(path: Path) -> set[str]:
    """The top-level parts of hf_layertie that a module imports (relative imports resolved)."""
    part = path.relative_to(PACKAGE).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = list(part[:-1])[: len(part) - node.level]
            target = [*base, *(node.module or "").split(".")] if node.module else base
            if not target:  # `from .. import x` at the top of the package
                target = [node.names[0].name]
            found.add(target[0].removesuffix(".py"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hf_layertie."):
            found.add(node.module.split(".")[1])
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer):
    paths = sorted((PACKAGE / layer).rglob("*.py")) if (PACKAGE / layer).is_dir() else [PACKAGE / f"{layer}.py"]
    for path in paths:
        crossing = package_imports(path) - ALLOWED[layer] - {layer}
        assert not crossing, f"{path.relative_to(PACKAGE)} imports {sorted(crossing)}, outside its layer's {sorted(ALLOWED[layer])}"


def test_the_table_covers_every_folder_and_module():
    parts = {path.stem for path in PACKAGE.iterdir() if path.suffix == ".py" and path.stem != "__init__"}
    parts |= {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}
    assert parts == set(ALLOWED)


def test_importing_the_package_leaves_the_matplotlib_backend_alone():
    import subprocess
    import sys

    code = "import matplotlib; matplotlib.use('svg'); import hf_layertie; print(matplotlib.get_backend())"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert completed.stdout.strip() == "svg"
