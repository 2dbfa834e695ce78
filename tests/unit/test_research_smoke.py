"""research/ keeps running: the house checks its experiment scripts too (``-k research_smoke``).

research/ holds one-off experiments kept as records (research/README.md indexes them); nothing
else runs them, so these tests keep each one rerunnable. For every ``research/*.py``:

* it imports cleanly, and importing it runs no experiment: nothing printed, torch's thread count
  left alone, and at its top level only imports, definitions, constants, ``sys.path`` set-up and
  an ``if __name__ == "__main__":`` guard (which it has);
* it reads kvviz's public names only: no ``from kvviz... import _name``, no private module, no
  ``alias._name`` on a kvviz module or a name imported from kvviz (a helper a script needs is made
  public in kvviz, with a docstring);
* it imports no other research script (a shared piece lives in the script that owns it, or in
  kvviz), and every kvviz name it imports, inside a function too, exists;
* the index (research/README.md) names it.

The imports run in this process (kvviz and torch are imported once for all of them).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
RESEARCH = REPO_ROOT / "research"
SCRIPTS = sorted(RESEARCH.glob("*.py"))
SCRIPT_NAMES = {path.stem for path in SCRIPTS}
# top-level statements that run no experiment (besides the docstring, sys.path calls and the guard)
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def private(name: str) -> bool:
    """A leading underscore that is not a dunder (``__main__``, ``__doc__`` are public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
            and len(node.test.comparators) == 1 and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value == "__main__")


def runs_nothing(node: ast.stmt) -> bool:
    """A top-level statement that defines, imports or sets ``sys.path`` (an experiment does more)."""
    if isinstance(node, DEFINITIONS) or is_main_guard(node):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return True  # a docstring
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) in ("sys.path.insert", "sys.path.append"))


def kvviz_bindings(tree: ast.AST) -> dict[str, str]:
    """The names a script binds to kvviz (``import kvviz.x as a``, ``from kvviz.x import y``, at the
    top or inside a function): name -> what it stands for."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvviz":
                    bound[alias.asname or "kvviz"] = alias.name if alias.asname else "kvviz"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "kvviz":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def attribute_chain(node: ast.Attribute) -> tuple[str | None, list[str]]:
    """``a.b.c`` -> ("a", ["b", "c"]); the root is None when it is not a plain name."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), chain[::-1]


def research_problems(source: str, scripts: set[str] = SCRIPT_NAMES) -> list[str]:
    """What keeps one research script's ``source`` from the house rules (an empty list: none).
    ``scripts``: the names of the research scripts it must not import."""
    tree = ast.parse(source)
    problems = []
    if not any(is_main_guard(node) for node in tree.body):
        problems.append('no `if __name__ == "__main__":` guard (put the experiment in main())')
    for node in tree.body:
        if not runs_nothing(node):
            problems.append(f"line {node.lineno}: runs at import ({ast.unparse(node).splitlines()[0][:60]}); move it into main()")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                problems.append(f"line {node.lineno}: a relative import")
                continue
            names = [node.module or ""]
            if names[0].split(".")[0] == "kvviz":
                problems += [f"line {node.lineno}: imports the private name {names[0]}.{alias.name}"
                             for alias in node.names if private(alias.name)]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "research" or top in scripts:
                problems.append(f"line {node.lineno}: imports the research script {name}")
            if top == "kvviz" and any(private(part) for part in name.split(".")):
                problems.append(f"line {node.lineno}: imports the private module {name}")
    bound = kvviz_bindings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root, chain = attribute_chain(node)
            first = next((i for i, part in enumerate(chain) if private(part)), None)
            if root in bound and first is not None:  # up to the first private part: a.b._c.d once
                problems.append(f"line {node.lineno}: reads the private name {root}.{'.'.join(chain[:first + 1])} "
                                f"({bound[root]})")
    return sorted(set(problems))


def missing_kvviz_names(source: str) -> list[str]:
    """The kvviz modules and names a script imports (inside a function too) that do not exist."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            wanted = [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "kvviz"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "kvviz":
            wanted = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module_name, name in wanted:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                missing.append(f"line {node.lineno}: no module {module_name}")
                continue
            if name is not None and not hasattr(module, name) and importlib.util.find_spec(f"{module_name}.{name}") is None:
                missing.append(f"line {node.lineno}: {module_name} has no {name}")
    return missing


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_research_smoke_script_imports_without_running_its_experiment(path, capsys, monkeypatch):
    saved_path, threads = list(sys.path), torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", [str(path)])
    name = f"research_smoke_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path[:0] = [str(RESEARCH), str(REPO_ROOT)]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved_path
        sys.modules.pop(name, None)
    printed = capsys.readouterr()
    assert not printed.out and not printed.err, f"importing {path.name} printed: {(printed.out + printed.err)[:200]}"
    assert torch.get_num_threads() == threads, f"importing {path.name} set torch's threads (do it in main())"
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_research_smoke_script_keeps_the_house_rules(path):
    assert research_problems(path.read_text()) == []


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_research_smoke_every_kvviz_name_a_script_imports_exists(path):
    assert missing_kvviz_names(path.read_text()) == []


def test_research_smoke_the_index_names_every_script():
    index = (RESEARCH / "README.md").read_text()
    files = sorted(path.name for path in RESEARCH.iterdir() if path.suffix in (".py", ".sh"))
    assert [name for name in files if f"`{name}`" not in index] == [], "add these to research/README.md"


def test_research_smoke_the_checker_refuses_what_the_rules_forbid():
    good = '"""A record."""\nimport sys\n\nfrom kvviz.studies import speed\n\n\ndef main():\n    speed.prompt_ids\n\n\n' \
           'if __name__ == "__main__":\n    main()\n'
    assert research_problems(good, {"other"}) == []
    bad = ("import torch\nimport kvviz.studies.speed as speed\nfrom kvviz.runtime import cache as kv\n"
           "from kvviz.studies.speed import _prompt_ids\nfrom other import helper\nimport research.other\n"
           "from kvviz.runtime.models import LoadedModel\n"
           "torch.set_num_threads(1)\nfor name in 'ab':\n    speed._copy(kv._private, LoadedModel._head)\n")
    problems = "\n".join(research_problems(bad, {"other"}))
    for expected in ("no `if __name__", "line 8: runs at import", "line 9: runs at import",
                     "private name kvviz.studies.speed._prompt_ids", "research script other",
                     "research script research.other", "private name speed._copy", "private name kv._private",
                     "private name LoadedModel._head"):
        assert expected in problems, (expected, problems)
    assert missing_kvviz_names("from kvviz.data import no_such_name\nimport kvviz.no_such_module\n") == [
        "line 1: kvviz.data has no no_such_name", "line 2: no module kvviz.no_such_module"]
