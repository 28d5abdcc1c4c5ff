"""reports/ stays navigable and its scripts stay honest.

- Every report (each entry of reports/ and of its group folders) is named in reports/README.md.
- Every script under reports/ either still fits the current package or says it does not: a .py
  script's imports (all of them, function-level ones included) run, and every `mtpspec` name it
  reaches through them exists and accepts the keywords it is called with; a .sh script parses,
  passes only flags some `mtpspec` command has, and names only reports/ paths that exist. A
  script whose first lines say "Historical: ran on commit ..." is kept as the record and skipped.
  Nothing here runs a script's work: top-level code beyond the imports is never executed.
- Every relative link in the README, docs/ and reports/README.md points at a file that exists.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import re
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
HISTORICAL = "Historical: ran on commit"


def _historical(path: Path) -> bool:
    return any(HISTORICAL in line for line in path.read_text().splitlines()[:5])


def _scripts(suffix: str) -> list[Path]:
    return sorted(p for p in REPORTS.rglob(f"*{suffix}") if "__pycache__" not in p.parts)


def _id(path: Path) -> str:
    return str(path.relative_to(REPORTS))


# --- the index ------------------------------------------------------------------------------


def test_every_report_is_named_in_the_index():
    index = (REPORTS / "README.md").read_text()

    def named(rel: str) -> bool:  # "bench/bench-ondevice-trees" must not pass on "...-trees2/"
        return re.search(re.escape(rel) + r"(?![\w.-])", index) is not None

    groups = [e for e in REPORTS.iterdir() if e.is_dir() and not e.name.startswith((".", "__"))]
    missing = [e.name for e in REPORTS.iterdir() if e.name != "README.md" and not named(f"{e.name}/")]
    missing += [f"{g.name}/{e.name}" for g in groups for e in g.iterdir()
                if not e.name.startswith((".", "__")) and not named(f"{g.name}/{e.name}")]
    assert not missing, f"reports/README.md does not name: {missing}"


# --- .py scripts ----------------------------------------------------------------------------


def _is_mtpspec(obj: Any) -> bool:
    name = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None) or ""
    return name == "mtpspec" or name.startswith("mtpspec.")


def _resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The object an expression `a.b.c` names, when `a` is an import; None if not one; raises
    AttributeError when an `mtpspec` object lacks the attribute."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, names)
        if base is None or not _is_mtpspec(base):
            return None
        if not hasattr(base, node.attr):
            raise AttributeError(f"{ast.unparse(node)}: {base!r} has no attribute {node.attr!r}")
        return getattr(base, node.attr)
    return None


def _check_call(call: ast.Call, fn: Any) -> str | None:
    """Whether `fn` accepts the call's positional count and keyword names (values unchecked)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind_partial(*[None] * len(call.args), **{k.arg: None for k in call.keywords if k.arg})
    except TypeError as e:
        return f"{ast.unparse(call.func)}(...): {e}"
    return None


@pytest.mark.parametrize("path", [p for p in _scripts(".py") if not _historical(p)], ids=_id)
def test_script_still_fits_the_package(path: Path):
    spec = importlib.util.spec_from_file_location(f"reports_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    source = path.read_text()
    tree = ast.parse(source, str(path))  # the whole script compiles
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    module = importlib.util.module_from_spec(spec)
    # Its imports, wherever they stand (inside functions too), run here; nothing else does.
    exec(compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec"), module.__dict__)
    if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
        spec.loader.exec_module(module)  # a script with a main guard imports whole, main unrun
    names = {k: v for k, v in vars(module).items() if isinstance(v, types.ModuleType) or _is_mtpspec(v)}
    problems = []
    for node in ast.walk(tree):
        try:
            if isinstance(node, ast.Attribute):
                _resolve(node, names)
            elif isinstance(node, ast.Call):
                fn = _resolve(node.func, names)
                if fn is not None and _is_mtpspec(fn) and callable(fn):
                    problems.append(_check_call(node, fn))
        except AttributeError as e:
            problems.append(str(e))
    problems = [p for p in problems if p]
    assert not problems, f"{_id(path)} no longer fits the package (fix it, or mark it '{HISTORICAL} ...'): {problems}"


# --- .sh scripts ----------------------------------------------------------------------------


@functools.cache
def _cli_options() -> set[str]:
    import typer

    from mtpspec.cli import app

    group = typer.main.get_command(app)
    return {o for c in group.commands.values() for p in c.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("path", [p for p in _scripts(".sh") if not _historical(p)], ids=_id)
def test_shell_script_still_fits_the_cli(path: Path):
    text = path.read_text()
    bash = shutil.which("bash")
    if bash is not None:
        r = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, f"{_id(path)} does not parse: {r.stderr}"
    # the flags of mtpspec's own command lines (continued lines joined; pip's, git's are theirs)
    commands = [c for c in re.split(r"&&|\|\||[;|()\n]", text.replace("\\\n", " ")) if re.search(r"(^|\s)mtpspec\s", c)]
    flags = {f for c in commands for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", c.split("mtpspec", 1)[1])}
    unknown = flags - _cli_options()
    assert not unknown, f"{_id(path)} passes flags no mtpspec command has: {sorted(unknown)}"
    paths = {m.rstrip(".,:") for m in re.findall(r"(?<![\w./-])reports/[^\s\"'`;)|\]}]+", text) if not {"$", "*"} & set(m)}
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"{_id(path)} names reports/ paths that do not exist: {gone}"


# --- links ----------------------------------------------------------------------------------


def _markdown_pages() -> list[Path]:
    return [ROOT / "README.md", REPORTS / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]
    broken = sorted({t for t in local if t and not (page.parent / t).exists()})
    assert not broken, f"{page.relative_to(ROOT)} links to missing paths: {broken}"
