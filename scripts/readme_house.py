"""The README's "How it is built" table, generated from the tree.

    python scripts/readme_house.py           # rewrite the table in README.md
    python scripts/readme_house.py --check   # exit 1 when README.md's table is out of date

One row per layer of kvviz, top to bottom in the order of ``.importlinter``'s first contract: the
layer's folder, the first sentence(s) of its package docstring, and what it holds. A folder's
modules and sub-packages come in the order of the folder's own contract (a line per level, top to
bottom; anything a contract leaves out comes last), each with the first sentence of its docstring,
shortened. The table sits between ``<!-- house:begin -->`` and ``<!-- house:end -->`` in README.md;
nothing else there is touched. The files are read, not imported (no torch).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvviz"
README = ROOT / "README.md"
BEGIN, END = "<!-- house:begin -->", "<!-- house:end -->"
ENTRY_POINTS = "Where kvviz starts: `python -m kvviz` and its subcommands (the page starts from `app.py`)."
LONGEST_PHRASE = 72  # characters of a module's phrase
LONGEST_SUMMARY = 110  # characters of a layer's sentences


def contracts(root: Path = ROOT) -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(root / ".importlinter")
    return config


def levels(section) -> list[list[str]]:
    """A layers contract's names, one list per line (``a | b`` and ``a : b`` share a line)."""
    return [[name.strip() for name in re.split(r"[|:]", line) if name.strip()]
            for line in section["layers"].split("\n") if line.strip()]


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def sentences(text: str) -> list[str]:
    """The first paragraph's sentences, rst ``code`` as markdown `code`."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    paragraph = re.sub(r"``([^`]+)``", r"`\1`", paragraph)
    return [s for s in re.split(r"(?<=[.?!])\s+(?=[A-Z`(])", paragraph) if s]


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters: before a parenthesis or at a comma (no mark), else at
    a word (with an ellipsis)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    for mark in (" (", ", "):
        if mark in cut[limit // 4:]:
            return cut[: cut.rindex(mark)].rstrip(",;: ")
    return cut[: cut.rindex(" ")].rstrip(",;: ") + "…" if " " in cut else cut + "…"


def lower_first(text: str) -> str:
    """Lower-case the first letter, unless the first words are a name (HotpotQA, KVComm's, C2C,
    Activation Communication)."""
    words = text.split(" ", 2)
    first, following = words[0], (words[1] if len(words) > 1 else "")
    a_name_goes_on = following[:1].isupper() and following[1:2].islower()  # "Activation Communication"
    if not first[:1].isupper() or any(c.isupper() or c.isdigit() for c in first[1:]) or a_name_goes_on:
        return text
    return text[0].lower() + text[1:]


def is_name(text: str) -> bool:
    """Mostly capitalised words or code: a name ("Activation Communication (AC)"), not a phrase."""
    words = [w for w in text.split() if w[:1] != "("]
    return text.startswith("`") or sum(w[:1].isupper() for w in words) * 2 > len(words)


def phrase(text: str) -> str:
    """A module's docstring as a short phrase: its first sentence; where that is a "name: what it
    is" sentence, the side that says more (before the colon, unless that is a name, a command or
    two words)."""
    first = (sentences(text) or [""])[0].rstrip(".")
    head, colon, tail = first.partition(": ")
    if not colon or not tail:
        return lower_first(clip(first.strip(), LONGEST_PHRASE))
    if len(head.split()) >= 3 and not is_name(head):
        return lower_first(clip(head.strip(), LONGEST_PHRASE))
    return clip(tail.strip(), LONGEST_PHRASE)


def summary(text: str) -> str:
    """A layer's package docstring as one or two short sentences."""
    out = []
    for sentence in sentences(text):
        if len(sentence) > LONGEST_SUMMARY or sentence.endswith(":"):
            head = sentence.partition(": ")[0].rstrip(":")
            sentence = clip(head, LONGEST_SUMMARY).rstrip(".") + "."
        if out and len(" ".join(out)) + len(sentence) > LONGEST_SUMMARY:
            break
        out.append(sentence)
        if sentence != text and len(out) == 2:
            break
    return " ".join(out)


def child_path(folder: Path, name: str) -> Path:
    return folder / name if (folder / name / "__init__.py").is_file() else folder / f"{name}.py"


def children(folder: Path, config: configparser.ConfigParser) -> list[list[str]]:
    """A package folder's modules and sub-packages, one list per level of its contract, then a
    last level with whatever the contract leaves out."""
    dotted = ".".join(folder.relative_to(ROOT).parts)
    section = next((config[s] for s in config.sections() if s.startswith("importlinter:contract:")
                    and config[s].get("containers", "").strip() == dotted), None)
    ordered = levels(section) if section is not None else []
    named = {name for level in ordered for name in level}
    present = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"} | {
        p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    rest = sorted(present - named)
    return [[n for n in level if n in present] for level in ordered if any(n in present for n in level)] + (
        [rest] if rest else [])


def item(folder: Path, name: str, config) -> str:
    path = child_path(folder, name)
    if path.is_dir():
        inner = ", ".join(f"`{n}/`" if (path / n).is_dir() else f"`{n}`" for level in children(path, config) for n in level)
        return f"`{name}/` ({phrase(docstring(path / '__init__.py'))}: {inner})"
    return f"`{name}` ({phrase(docstring(path))})"


def escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def table(root: Path = ROOT) -> str:
    """The markdown table, one row per layer of the first contract, top to bottom."""
    config = contracts(root)
    first = next(config[s] for s in config.sections() if s.startswith("importlinter:contract:"))
    rows = ["| layer | what it is | what it holds, top to bottom (a line per level) |", "|---|---|---|"]
    for level in levels(first):
        names = [name.split(".", 1)[1] for name in level]
        if all((PACKAGE / f"{name}.py").is_file() for name in names):  # the entry points: modules of kvviz/
            layer = "entry points: " + ", ".join(f"`kvviz/{name}.py`" for name in names)
            what, holds = ENTRY_POINTS, ", ".join(item(PACKAGE, name, config) for name in names)
        else:
            (name,) = names
            folder = PACKAGE / name
            layer, what = f"`kvviz/{name}/`", summary(docstring(folder / "__init__.py"))
            holds = "<br>".join(", ".join(item(folder, n, config) for n in names_) for names_ in children(folder, config))
        rows.append(f"| {escape(layer)} | {escape(what)} | {escape(holds)} |")
    return "\n".join(rows)


def with_table(readme: str, new_table: str) -> str:
    """``readme`` with the text between the markers replaced by ``new_table``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise SystemExit(f"README.md needs one {BEGIN} before one {END}")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{new_table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's table is out of date")
    args = parser.parse_args(argv)
    readme = README.read_text(encoding="utf-8")
    updated = with_table(readme, table())
    if args.check:
        if updated != readme:
            print("README.md's 'How it is built' table is out of date: run python scripts/readme_house.py", file=sys.stderr)
            return 1
        return 0
    if updated != readme:
        README.write_text(updated, encoding="utf-8")
        print("README.md: the 'How it is built' table rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
