"""The package's layers (README, "Architecture"): a module of ``src/zhie`` imports only from its own layer and the
layers below it, at any depth (inside functions too), with module paths named in strings (``importlib``, the CLI's
optional extras) counted as imports; ``zhie/core`` imports no torch at all, and what the runtime extra runs (the CLI,
the tasks, an export's pipeline) imports torch only inside functions.

Read from the source (``ast``), nothing is imported."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "zhie"

# Lowest first. A module is in the layer of the longest of these names that is it or a package holding it.
LAYERS = {
    "core": ("zhie.core", "zhie.version"),
    "data": ("zhie.data",),
    "models": ("zhie.encoders", "zhie.heads", "zhie.losses", "zhie.model", "zhie.precision", "zhie.dist",
               "zhie.multitask"),
    "tasks": ("zhie.tasks",),
    "training": ("zhie.training",),
    "deploy": ("zhie.deploy",),
    "top": ("zhie", "zhie.__main__", "zhie.cli", "zhie.demo"),
}
RANK = {layer: rank for rank, layer in enumerate(LAYERS)}
TORCH = ("torch", "transformers", "accelerate")  # the train extra's: the runtime extra has none of them
# What the runtime extra runs (zhie predict/segment/embed/eval on an export): these modules (``.*``: a package and
# all its modules), and whatever they import when imported, import torch only inside functions.
TORCH_FREE_ROOTS = ("zhie", "zhie.__main__", "zhie.cli", "zhie.core.*", "zhie.data.*", "zhie.tasks.*",
                    "zhie.deploy.pipeline", "zhie.deploy.runtime", "zhie.deploy.stream", "zhie.deploy.error_report")
MODULE_PATH = re.compile(r"zhie(\.\w+)+")


@dataclass(frozen=True)
class Import:
    module: str     # the zhie module imported (or a third-party top-level name, for TORCH)
    line: int
    at_import: bool  # runs when the importing module is imported (not inside a function, nor under TYPE_CHECKING)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_under(module: str, root: str) -> bool:
    """Whether ``module`` is ``root``, or, for a root ``PACKAGE.*``, that package or one of its modules."""
    return module == root.removesuffix(".*") or (root.endswith(".*") and module.startswith(root[:-1]))


def is_module(name: str) -> bool:
    return name in MODULES


def shown(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent)) if path.is_relative_to(PACKAGE.parent) else str(path)


def layer_of(module: str) -> str:
    owners = [(len(prefix), layer) for layer, prefixes in LAYERS.items() for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")]
    return max(owners)[1] if owners else "unassigned"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str) -> list[Import]:
    """Every import of ``module``: its zhie modules (``from zhie import tasks`` is :mod:`zhie.tasks`, ``from zhie
    import load`` is the package's top), the top-level names of the others, and the zhie module paths of its strings."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, at_import) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(sub if is_module(sub) else base, node.lineno, at_import))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.fullmatch(node.value):
            if is_module(node.value):
                found.append(Import(node.value, node.lineno, False))
        inside = at_import and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and \
            not (isinstance(node, ast.If) and _is_type_checking(node))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return list(dict.fromkeys(found))  # one per module and line


def zhie_imports(module: str) -> list[Import]:
    return [i for i in imports(module) if i.module == "zhie" or i.module.startswith("zhie.")]


def upward_imports(module: str) -> list[str]:
    """The imports of ``module`` from a layer above its own, as messages."""
    mine = layer_of(module)
    return [f"{shown(MODULES[module])}:{i.line}: {module} ({mine}) imports {i.module} "
            f"({layer_of(i.module)}), a higher layer"
            for i in zhie_imports(module) if RANK[layer_of(i.module)] > RANK[mine]]


def torch_imports(module: str, at_import_only: bool) -> list[Import]:
    return [i for i in imports(module) if i.module.split(".")[0] in TORCH and (i.at_import or not at_import_only)]


# ----------------------------------------------------------------------------------------------------------- tests
def test_every_module_has_a_layer():
    unassigned = [m for m in MODULES if layer_of(m) == "unassigned"]
    assert not unassigned, f"modules in no layer (add them to LAYERS): {unassigned}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_downwards(module):
    found = upward_imports(module)
    assert not found, "\n".join(found)


def test_the_core_imports_no_torch():
    found = [f"{m}:{i.line} imports {i.module}" for m in MODULES if layer_of(m) == "core"
             for i in torch_imports(m, at_import_only=False)]
    assert not found, "\n".join(found)


def packages(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module`` is imported (``zhie.multitask.config``: ``zhie`` and
    ``zhie.multitask``)."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def test_what_the_runtime_runs_imports_torch_only_inside_functions():
    """From each root, follow the zhie imports that run when a module is imported (and the packages holding each
    module reached, whose ``__init__`` runs first); none of the modules reached may import torch (transformers,
    accelerate) then: ``pip install "zhie[runtime]"`` has none of them."""
    seen: dict[str, str] = {}  # module -> the module whose import reached it
    todo = [(m, "a root") for m in MODULES if any(is_under(m, root) for root in TORCH_FREE_ROOTS)]
    while todo:
        module, by = todo.pop()
        if module in seen:
            continue
        seen[module] = by
        todo += [(i.module, module) for i in zhie_imports(module) if i.at_import and i.module in MODULES]
        todo += [(package, module) for package in packages(module) if package in MODULES]
    found = [f"{m}:{i.line} imports {i.module} (reached from {seen[m]})" for m in sorted(seen)
             for i in torch_imports(m, at_import_only=True)]
    assert not found, "\n".join(found)


def test_the_package_top_imports_only_the_version_when_imported():
    """Every ``import zhie.…`` runs ``zhie/__init__.py`` first: it may name the whole package (``load``, ``fit``) only
    inside functions."""
    assert [i.module for i in zhie_imports("zhie") if i.at_import] == ["zhie.version"]


def test_the_task_registry_names_task_modules():
    """:data:`zhie.tasks.MODULES` names modules of ``zhie/tasks`` (imported on demand, so not seen as imports above),
    and :data:`zhie.tasks.COMMANDS` tasks that it knows."""
    tree = ast.parse(MODULES["zhie.tasks"].read_text(encoding="utf-8"))
    tables = {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and t.id in ("MODULES", "COMMANDS")}
    assert {f"zhie.tasks.{m}" for m in tables["MODULES"].values()} <= set(MODULES)
    assert {task for task, _ in tables["COMMANDS"].values()} <= set(tables["MODULES"])


def test_an_import_from_above_is_found(tmp_path, monkeypatch):
    """The checks see an upward import inside a function, one named in a string, and torch in the core."""
    module = tmp_path / "zhie" / "core" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text('import torch\n\n\ndef f():\n    from zhie.deploy import stream\n\n\nNAME = "zhie.cli"\n',
                      encoding="utf-8")
    monkeypatch.setitem(MODULES, "zhie.core.bad", module)
    assert [m.split(": ", 1)[1] for m in upward_imports("zhie.core.bad")] == [
        "zhie.core.bad (core) imports zhie.deploy.stream (deploy), a higher layer",
        "zhie.core.bad (core) imports zhie.cli (top), a higher layer"]
    assert [(i.module, i.at_import) for i in torch_imports("zhie.core.bad", at_import_only=False)] == [("torch", True)]
