"""The layer contract covers every kvviz module (``lint-imports`` in CI checks the imports)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import kvviz

ROOT = Path(kvviz.__file__).resolve().parent


def modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["kvviz", *path.relative_to(ROOT).with_suffix("").parts]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def layers() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT.parent / ".importlinter")
    return [name.strip() for line in config["importlinter:contract:layers"]["layers"].split("\n")
            for name in re.split(r"[|:]", line) if name.strip()]


def test_every_kvviz_module_sits_in_a_layer():
    declared = layers()
    assert len(declared) == len(set(declared)), "a module is named in two layers"
    unknown = [name for name in declared if name not in modules()]
    assert not unknown, f"layers name modules that do not exist: {unknown}"
    # the root package holds no code of its own
    uncovered = [name for name in modules() if name != "kvviz"
                 and not any(name == layer or name.startswith(layer + ".") for layer in declared)]
    assert not uncovered, f"add these modules to a layer in .importlinter: {uncovered}"


def test_the_root_package_holds_no_code():
    source = (ROOT / "__init__.py").read_text()
    assert "import kvviz" not in source and "from kvviz" not in source
