"""No import cycle among the modules of `mtpspec.core`: each can be read, tested and changed
after the ones it imports, never together with them. Counted from the source: imports at
module level and inside functions alike (an import inside a function is a cycle deferred, not
removed); only imports under `if TYPE_CHECKING:` (annotations only) are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import mtpspec.core

CORE = Path(mtpspec.core.__file__).parent
PACKAGE = "mtpspec.core"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(node: ast.AST, module: str, names: set[str]) -> set[str]:
    """The core modules `module`'s code under `node` imports, TYPE_CHECKING blocks left out."""
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # `else:` of a TYPE_CHECKING block runs
                found |= _imported(ast.Module(body=[other], type_ignores=[]), module, names)
            continue
        if isinstance(child, ast.Import):
            found |= {a.name.removeprefix(PACKAGE + ".").split(".")[0] for a in child.names if a.name.startswith(PACKAGE + ".")}
        elif isinstance(child, ast.ImportFrom):
            if child.level == 1:  # from . import x / from .x import y
                base = child.module.split(".")[0] if child.module else None
            elif child.level == 0 and child.module and (child.module + ".").startswith(PACKAGE + "."):
                base = child.module.removeprefix(PACKAGE).lstrip(".").split(".")[0] or None
            elif child.level == 2 and child.module and (child.module + ".").startswith("core."):  # from ..core.x
                base = child.module.removeprefix("core").lstrip(".").split(".")[0] or None
            else:  # the parent package (`from ..errors`) or another package
                continue
            found |= {base} if base else {a.name for a in child.names}
        found |= _imported(child, module, names)
    return found & names - {module}


def import_graph() -> dict[str, set[str]]:
    """core module -> the core modules it imports."""
    names = {p.stem for p in CORE.glob("*.py") if p.stem != "__init__"}
    return {m: _imported(ast.parse((CORE / f"{m}.py").read_text()), m, names) for m in sorted(names)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None: a depth-first search for a back edge."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)) is not None:
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)) is not None:
            return cycle
    return None


def test_core_modules_import_each_other_without_a_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "core modules import each other in a cycle: " + " -> ".join(cycle or [])


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking_blocks():
    names = {"a", "b", "c", "d"}
    src = (
        "from typing import TYPE_CHECKING\n"
        "from . import a\n"
        "if TYPE_CHECKING:\n"
        "    from .c import C\n"
        "def f():\n"
        "    from .b import g\n"
        "    import mtpspec.core.d\n"
        "    from ..errors import InputError\n"
    )
    assert _imported(ast.parse(src), "x", names) == {"a", "b", "d"}
    assert _imported(ast.parse("from ..core import c\nfrom mtpspec.core.b import B"), "x", names) == {"b", "c"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
