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


def module_imports(path: Path) -> set[str]:
    """The package's modules (dotted, relative to hf_layertie) that the module at `path` imports, `TYPE_CHECKING`
    blocks included: `from .x import y` names module `x.y` where that is a module, else `x`."""
    modules = {_dotted(other) for other in PACKAGE.rglob("*.py")}
    here = _dotted(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            elif (node.module or "").startswith("hf_layertie."):
                base = node.module.removeprefix("hf_layertie.")
            else:
                continue
            for alias in node.names:
                named = f"{base}.{alias.name}" if base else alias.name
                found.add(named if named in modules else base)
    return found & modules - {here}


def _dotted(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other():
    """Not even for type hints: a pair that does is one concern split in two, or a type in the wrong module."""
    graph = {_dotted(path): module_imports(path) for path in PACKAGE.rglob("*.py")}
    mutual = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, set())})
    assert mutual == [], f"modules importing each other: {mutual}"
    # The relative imports are resolved (a parse that found nothing would pass the check above).
    assert {"models.tying_map", "models.adapter_export"} <= graph["models.tied_blocks"] and "engine.processes" in graph["engine.tying_engine"]
