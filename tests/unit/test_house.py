"""The house rules of kvviz's code, checked in the unit tier (README "How it is built").

1. **Layers point one way.** kvviz's folders are its layers, top to bottom as the first contract of
   ``.importlinter`` lists them (entry points, app, studies, engine, handoffs, runtime, data,
   core): a module imports from its own layer's lower rooms and from the layers below, never
   above. ``lint-imports`` checks the imports in CI; here: every kvviz module sits in a layer, and
   every module a contract names exists.
2. **No cycles, at any level.** Between the modules and folders of one package (a folder counts as
   one node beside its siblings), all the way down: ``acyclic_siblings`` in ``.importlinter``,
   and ``test_no_import_cycle_between_sibling_folders_or_modules`` here, on grimp's graph.
3. **No kvviz import inside a function** in kvviz/: every dependency shows at the top of its module
   (the CLI reaches a subcommand's module by name, through importlib).
4. **The root package holds no code**, so ``import kvviz`` costs nothing.
5. **Small functions**: none over 80 lines (the page, the run and the decode loop are built in
   pieces).
6. **Rooms of readable size**: no module over 400 lines; a module that grows past it is split
   along its real seams (a room does one job). The 14 modules over it when the rule came (issue #40)
   were split by their owners.
7. **The README says what the tree is.** Its "How it is built" table (a row per layer, what each
   holds) is generated from the tree by ``scripts/readme_house.py``; it names every package and
   is what the script writes.

research/ has its own rules (``tests/unit/test_research_smoke.py``).
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import re
from pathlib import Path

import grimp
import pytest

import kvviz

ROOT = Path(kvviz.__file__).resolve().parent
REPO_ROOT = ROOT.parent
LONGEST_FUNCTION = 80
LONGEST_MODULE = 400


def modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["kvviz", *path.relative_to(ROOT).with_suffix("").parts]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def contracts() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT.parent / ".importlinter")
    return config


def layer_names(section) -> list[str]:
    return [name.strip() for line in section["layers"].split("\n") for name in re.split(r"[|:]", line) if name.strip()]


def layers() -> list[str]:
    return layer_names(contracts()["importlinter:contract:layers"])


def test_every_kvviz_module_sits_in_a_layer():
    declared = layers()
    assert len(declared) == len(set(declared)), "a module is named in two layers"
    unknown = [name for name in declared if name not in modules()]
    assert not unknown, f"layers name modules that do not exist: {unknown}"
    # the root package holds no code of its own
    uncovered = [name for name in modules() if name != "kvviz"
                 and not any(name == layer or name.startswith(layer + ".") for layer in declared)]
    assert not uncovered, f"add these modules to a layer in .importlinter: {uncovered}"


def test_every_module_a_contract_names_exists():
    config, known = contracts(), set(modules())
    named = []
    for section in config.sections():
        if not section.startswith("importlinter:contract:") or "layers" not in config[section]:
            continue
        containers = [c.strip() for c in config[section].get("containers", "").split("\n") if c.strip()] or [""]
        named += [f"{container}.{name}" if container else name for container in containers
                  for name in layer_names(config[section])]
    assert [name for name in named if name not in known] == []


def test_the_root_package_holds_no_code():
    source = (ROOT / "__init__.py").read_text()
    assert "import kvviz" not in source and "from kvviz" not in source


def test_no_kvviz_import_inside_a_function():
    local = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if (isinstance(inner, ast.Import) and any(a.name.split(".")[0] == "kvviz" for a in inner.names)) or (
                        isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").split(".")[0] == "kvviz")):
                    local.append(f"{path.relative_to(ROOT.parent)}:{inner.lineno} in {node.name}")
    assert sorted(set(local)) == []


def test_the_functions_are_small():
    """No function of kvviz over 80 lines: the page, the run and the decode loop are built in pieces."""
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} is {length} lines")
    assert long == []


def module_lengths() -> dict[str, int]:
    return {str(path.relative_to(REPO_ROOT)): len(path.read_text().splitlines()) for path in sorted(ROOT.rglob("*.py"))}


def test_no_module_is_over_400_lines():
    """Rooms of readable size: no kvviz module over 400 lines."""
    long = {path: lines for path, lines in module_lengths().items() if lines > LONGEST_MODULE}
    assert long == {}, "split them along their seams"


# --- no cycle between the siblings of any package ---------------------------------------------------


def sibling_cycles(graph, package: str) -> list[list[str]]:
    """The import cycles among ``package``'s children, each folder squashed into one node (an
    import from or into anything inside it counts as its own): for each sibling on a cycle not yet
    reported, the shortest cycle through it, the first sibling again at the end."""
    children = sorted(graph.find_children(package))
    edges = {child: [other for other in children if other != child
                     and graph.direct_import_exists(importer=child, imported=other, as_packages=True)]
             for child in children}
    cycles, reported = [], set()
    for start in children:
        if start in reported:
            continue
        came_from, queue = {}, [start]  # breadth first from start, until an edge leads back to it
        while queue and start not in came_from:
            node = queue.pop(0)
            for after in edges[node]:
                if after not in came_from:
                    came_from[after] = node
                    queue.append(after)
        if start not in came_from:
            continue
        cycle = [start]
        while len(cycle) == 1 or cycle[-1] != start:
            cycle.append(came_from[cycle[-1]])
        cycle.reverse()
        cycles.append(cycle)
        reported.update(cycle)
    return cycles


def example_import(graph, importer: str, imported: str) -> str:
    """One import that makes ``importer`` (or a module inside it) import ``imported`` (or inside it)."""
    for module in sorted({importer} | graph.find_descendants(importer)):
        for target in sorted(graph.find_modules_directly_imported_by(module)):
            if target == imported or target.startswith(imported + "."):
                return f"{module} -> {target}"
    return f"{importer} -> {imported}"


@pytest.fixture(scope="module")
def kvviz_graph():
    return grimp.build_graph("kvviz", cache_dir=None)


def test_no_import_cycle_between_sibling_folders_or_modules(kvviz_graph):
    packages = sorted(m for m in kvviz_graph.modules if kvviz_graph.find_children(m))
    found = []
    for package in packages:
        for cycle in sibling_cycles(kvviz_graph, package):
            found.append(" -> ".join(name.rsplit(".", 1)[-1] for name in cycle) + f" (in {package}: "
                         + "; ".join(example_import(kvviz_graph, a, b) for a, b in zip(cycle, cycle[1:])) + ")")
    assert found == []


def test_the_cycle_check_finds_a_cycle_through_a_folder():
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.a.inner", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a.inner", imported="pkg.b")  # a folder's module imports b ...
    graph.add_import(importer="pkg.b", imported="pkg.a")  # ... and b imports the folder
    graph.add_import(importer="pkg.c", imported="pkg.b")  # c only imports: no cycle through it
    assert sibling_cycles(graph, "pkg") == [["pkg.a", "pkg.b", "pkg.a"]]
    assert example_import(graph, "pkg.a", "pkg.b") == "pkg.a.inner -> pkg.b"
    assert sibling_cycles(graph, "pkg.a") == []


# --- the README's table of the layers --------------------------------------------------------------


def readme_house():
    """scripts/readme_house.py as a module."""
    spec = importlib.util.spec_from_file_location("readme_house", REPO_ROOT / "scripts" / "readme_house.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def packages_missing_from(readme: str) -> list[str]:
    """The kvviz packages (folders with an ``__init__.py``) that ``readme``'s house table does not
    name: a layer's folder as its row's first cell, a sub-package as `name/` in its layer's row."""
    house = readme_house()
    if house.BEGIN not in readme or house.END not in readme:
        return ["the README has no house table"]
    table = readme.split(house.BEGIN, 1)[1].split(house.END, 1)[0]
    rows = {line.split(" | ")[0].lstrip("| ").strip(): line for line in table.splitlines() if line.startswith("| `kvviz/")}
    missing = []
    for init in sorted(ROOT.rglob("__init__.py")):
        parts = init.parent.relative_to(ROOT).parts
        if not parts:
            continue  # kvviz itself: the table is its
        row = rows.get(f"`kvviz/{parts[0]}/`", "")
        if not row or (len(parts) > 1 and f"`{parts[-1]}/`" not in row):
            missing.append("/".join(("kvviz", *parts)))
    return missing


def test_every_package_is_in_the_readme_table():
    assert packages_missing_from((REPO_ROOT / "README.md").read_text()) == []


def test_the_readme_table_is_the_one_the_tree_gives():
    house = readme_house()
    readme = (REPO_ROOT / "README.md").read_text()
    assert house.with_table(readme, house.table()) == readme, "run python scripts/readme_house.py"
    assert house.main(["--check"]) == 0


def test_the_readme_checks_refuse_a_stale_table(tmp_path, monkeypatch):
    house = readme_house()
    readme = (REPO_ROOT / "README.md").read_text()
    without_page = readme.replace("`page/`", "`pages/`")
    assert packages_missing_from(without_page) == ["kvviz/app/page"]
    without_data = "".join(line for line in readme.splitlines(keepends=True) if not line.startswith("| `kvviz/data/`"))
    assert packages_missing_from(without_data) == ["kvviz/data"]
    stale = tmp_path / "README.md"
    stale.write_text(without_data)
    monkeypatch.setattr(house, "README", stale)
    assert house.main(["--check"]) == 1
    assert house.main([]) == 0 and stale.read_text() == readme  # the script writes the table back
