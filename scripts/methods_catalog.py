"""The page's methods without their code: assets/methods.json, written from the registry.

    python scripts/methods_catalog.py           # rewrite assets/methods.json
    python scripts/methods_catalog.py --check   # exit 1 when it is out of date

The file is what ``kvviz.app.reading.catalog`` reads (names, labels, titles, colours, controls,
chip groups, in page order), so that the reading, the exercises and the workshop know the methods
without importing torch. Run it after adding a handoff or changing a descriptor's label, title,
summary, colour, control or default, or a page entry's column.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvviz.app.methods.registry import catalog  # noqa: E402
from kvviz.app.reading.catalog import CATALOG_PATH  # noqa: E402


def text() -> str:
    about = "written by scripts/methods_catalog.py from the handoff registry and kvviz/app/methods: do not edit"
    return json.dumps({"about": about, "methods": catalog()}, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when assets/methods.json is out of date")
    args = parser.parse_args(argv)
    current = CATALOG_PATH.read_text(encoding="utf-8") if CATALOG_PATH.exists() else ""
    if args.check:
        if current != text():
            print(f"{CATALOG_PATH} is out of date: python scripts/methods_catalog.py")
            return 1
        return 0
    CATALOG_PATH.write_text(text(), encoding="utf-8")
    print(f"wrote {CATALOG_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
