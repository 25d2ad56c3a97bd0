"""The layering holds (docs/design.md §8), and each top-level package imports on its own.

The graph is read from the source by ``scripts/import_graph.py``: an import inside a
function is an edge like any other, and so is an entry of the lazy facade.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("aicf_import_graph", ROOT / "scripts" / "import_graph.py")
graph = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(graph)

# What each layer may import besides itself (docs/design.md §8): the core sits at the
# bottom; the library (candidate Emits) and the runtime (running a compiled model) on it;
# the Relax passes and the schedules on the core, and on the runtime where a rule needs
# a runtime fact (CPU features, the call-time checks it plans); the driver on everything.
MAY_IMPORT = {
    "core": {"core"},
    "library": {"core", "library"},
    "runtime": {"core", "runtime"},
    "passes": {"core", "runtime", "passes"},
    "schedules": {"core", "runtime", "schedules"},
}

# The public names ``aicf_tvm`` loads on first use (``aicf_tvm/__init__.py``'s ``_LAZY``):
# the one place the package names the layers above the core, so that importing the core
# stays light and ``aicf_tvm.load`` needs only TVM's runtime.
PUBLIC_LAZY = {
    "compile", "compile_optimizer_step", "compile_causal_lm", "CausalLM", "CompiledModel", "explain", "from_onnx",
    "from_torch",
    "load_model", "tune", "TuneResult", "load", "contract_problems", "verify_contracts", "get_pipeline",
}


def layer(module: str) -> str:
    if module.startswith("relax_passes"):
        return "passes"
    if module.startswith("schedules"):
        return "schedules"
    if module == "aicf_tvm":
        return "api"
    return module.split(".")[1]  # aicf_tvm.<core | library | runtime | driver>


@pytest.fixture(scope="module")
def edges() -> list:
    return graph.edges()


def test_every_module_is_in_a_layer():
    assert {layer(m) for m in graph.modules()} == {*MAY_IMPORT, "driver", "api"}


def test_imports_point_down(edges):
    """The core imports only TVM; passes and schedules import the core (not each other,
    nor the library or the driver); only the driver imports passes and schedules; the
    package itself loads the core eagerly and the rest through its facade."""
    wrong = [f"{e.source}:{e.line} -> {e.target}" for e in edges
             if layer(e.source) not in ("driver", "api") and layer(e.target) not in MAY_IMPORT[layer(e.source)]]
    assert not wrong, wrong
    eager = [e for e in edges if layer(e.source) == "api" and not e.facade]
    assert eager and all(layer(e.target) == "core" for e in eager), eager


def test_no_deferred_import_of_our_modules_outside_the_cli(edges):
    """An import inside a function hides a dependency; only the CLI defers (its commands
    import the compiler side on start, so ``aicf run`` works with TVM's runtime alone)."""
    deferred = [f"{e.source}:{e.line} -> {e.target}" for e in edges
                if e.deferred and not e.facade and e.source != "aicf_tvm.driver.cli"]
    assert not deferred, deferred


def test_the_lazy_facade_is_the_only_way_up_and_names_the_public_api(edges):
    facade = [e for e in edges if e.facade]
    assert {e.source for e in facade} == {"aicf_tvm"}
    assert all(layer(e.target) in ("runtime", "driver") for e in facade)
    tree = ast.parse((ROOT / "aicf_tvm" / "__init__.py").read_text())
    assert set(graph.facade_table(tree)) == PUBLIC_LAZY


def _names_our_module(arg: ast.expr) -> bool:
    """Whether a module name given as a literal (or an f-string's literal head) is ours."""
    head = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else arg
    text = head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else ""
    return text.startswith(".") or text.split(".")[0] in graph.PACKAGES


def test_no_string_import_of_our_modules_outside_the_facade():
    """``importlib.import_module("aicf_tvm...")`` would be an edge the graph cannot see."""
    found = []
    for module, path in graph.modules().items():
        if module == "aicf_tvm":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and node.args
                    and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
                    and _names_our_module(node.args[0])):
                found.append(f"{module}:{node.lineno}")
    assert not found, found


def test_no_import_cycle(edges):
    assert graph.cycles(edges) == []


@pytest.mark.parametrize("package", ["aicf_tvm", "relax_passes", "schedules"])
def test_package_imports_in_a_fresh_interpreter_without_the_driver(package):
    code = (
        f"import {package}, sys; "
        "driver = [m for m in sys.modules if m.startswith('aicf_tvm.driver')]; "
        "assert not driver, driver"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_core_does_not_import_passes_or_schedules():
    code = (
        "import sys, aicf_tvm; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('relax_passes', 'schedules')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_importing_the_driver_parses_no_tvmscript():
    """TVMScript's ``@T.prim_func`` calls ``inspect.stack()``, which under an import reads
    the source of every frame: ten of them at import made every model's import 3.6 s
    longer (the int8 tensor intrinsics, now registered on first use)."""
    code = (
        "import inspect; calls = []; stack = inspect.stack; "
        "inspect.stack = lambda *a, **k: calls.append(1) or stack(*a, **k); "
        "import aicf_tvm, aicf_tvm.driver.frontends, aicf_tvm.driver.pipeline, aicf_tvm.driver.llm, "
        "aicf_tvm.driver.cli, schedules, relax_passes, aicf_tvm.library; "
        "assert not calls, f'{len(calls)} inspect.stack() calls at import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
