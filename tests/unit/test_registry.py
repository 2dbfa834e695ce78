"""The handoff registry: descriptors, options, requirements, and the promise that a new handoff is
its method file, its page file and one registry line each (and the catalog of the page's methods
written from them: ``python scripts/methods_catalog.py``). A throwaway handoff written into two
temporary modules shows up in the CLI help, the page's columns and settings, the benchmark's
variants and the engine, with no other file edited. The lists of methods agree: the handoff modules,
their page modules, the import contracts and the catalog."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from kvviz.app.methods import registry as methods
from kvviz.app.reading import catalog
from kvviz.core.results import HandoffRequest
from kvviz.handoffs import registry
from kvviz.handoffs.registry import Handoff, Option, all_of, needs_context, parse_values

THROWAWAY = '''
"""A throwaway handoff for the registry test: the receiver answers with the sharer's first words."""
from kvviz.handoffs.registry import Handoff, Option, option_values
from kvviz.core.results import HandoffResult

OPTIONS = (Option("words", "how many words to echo", 2, kind="int", minimum=1, maximum=5,
                  sweep_flag="--echo-words-list", sweep_default="1,3"),)


def run(pair, request, io):
    words = option_values(request, "echo", OPTIONS)["words"]
    return HandoffResult(handoff="echo", pair=pair.name, answer=" ".join((request.context or "").split()[:words]))


HANDOFFS = (
    Handoff(name="echo", title="Echo: the first words", label="Echo", color="#123456",
            summary="the receiver repeats the sharer's first words", run=run,
            options=OPTIONS, variant_label=lambda values: f"echo@{values['words']}",
            no_receiver_prompt="not computed: echo has no receiver state", default=True),
)
'''

THROWAWAY_PAGE = '''
"""The throwaway handoff's page: its column and how it works."""
from kvviz.app.methods.registry import MethodPage

PAGES = (MethodPage(name="echo", column=99, explanation="It echoes."),)
'''


@pytest.fixture()
def restored_registry():
    saved, saved_pages = dict(registry.HANDOFFS), dict(methods.PAGES)
    yield registry
    registry.HANDOFFS.clear()
    registry.HANDOFFS.update(saved)
    methods.PAGES.clear()
    methods.PAGES.update(saved_pages)


@pytest.fixture()
def echo(tmp_path, monkeypatch, restored_registry):
    """Write the throwaway handoff's two files and register them: the method with its registry
    line, the page with its registry line."""
    (tmp_path / "kvviz_echo_handoff.py").write_text(textwrap.dedent(THROWAWAY), encoding="utf-8")
    (tmp_path / "kvviz_echo_page.py").write_text(textwrap.dedent(THROWAWAY_PAGE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.register_module(importlib.import_module("kvviz_echo_handoff"))  # kvviz.handoffs.HANDOFF_MODULES
    methods.register_module(importlib.import_module("kvviz_echo_page"))  # kvviz.app.methods.PAGE_MODULES
    # the catalog written again from the registry (scripts/methods_catalog.py), for this test only
    monkeypatch.setattr(catalog, "METHODS", {entry["name"]: catalog.Method(**entry) for entry in methods.catalog()})
    yield registry.get("echo")
    sys.modules.pop("kvviz_echo_handoff", None)
    sys.modules.pop("kvviz_echo_page", None)


def test_a_new_handoff_reaches_the_cli_help(echo):
    from kvviz.cli import build_parser

    parser = build_parser()
    run_help = " ".join(parser._subparsers._group_actions[0].choices["run"].format_help().split())
    assert "echo = the receiver repeats the sharer's first words" in run_help
    assert "--echo-words WORDS how many words to echo" in run_help
    bench_help = parser._subparsers._group_actions[0].choices["bench"].format_help()
    assert "--echo-words-list" in bench_help
    args = parser.parse_args(["run", "--query", "Q?", "--echo-words", "4", "--handoffs", "echo"])
    from kvviz.commands import request_from_args

    assert request_from_args(args).options["echo"] == {"words": 4}


def test_a_new_handoff_becomes_a_page_column_with_its_settings(echo):
    from kvviz.app import ui

    assert ui.column_names()[-1] == "echo" and "echo" in ui.default_columns()
    assert any(spec.handoff.name == "echo" and spec.option.name == "words" for spec in ui.page_options())
    assert "echo_words" in ui.run_parameter_names(ui.page_options())
    demo = ui.build_demo(precomputed={}, sweep=None)
    elem_ids = {getattr(block, "elem_id", None) for block in demo.blocks.values()}
    assert {"kv-col-echo", "kv-answer-echo", "kv-opt-echo-words"} <= elem_ids


def test_a_new_handoff_gets_bench_variants_and_runs_through_the_engine(echo):
    from kvviz.engine.runner import run_handoff
    from kvviz.studies.bench.run import expand_variants
    from tests.conftest import tiny_pair

    variants = expand_variants(["receiver", "echo"])
    assert [(v.label, v.options) for v in variants] == [("receiver", {}), ("echo@1", {"words": 1}), ("echo@3", {"words": 3})]
    request = echo.with_options(HandoffRequest(query="Q?", context="one two three four"), {"words": 3})
    assert run_handoff("echo", tiny_pair("llama"), request).answer == "one two three"


def test_option_values_are_checked_with_clear_messages():
    option = Option("ratio", "KVComm ratio", 0.5, minimum=0.0, maximum=1.0)
    assert option.parse("0.25") == 0.25 and option.parse(None) == 0.5 and option.parse("") == 0.5
    with pytest.raises(ValueError, match="between 0 and 1"):
        option.parse(2)
    with pytest.raises(ValueError, match="not a number"):
        option.parse("lots")
    assert option.parse_list("0.3, 0.5,") == [0.3, 0.5]
    auto = Option("alpha", "alpha", 0.8, auto="the paper's")
    assert auto.parse(None) is None and auto.parse(0.2) == 0.2
    choice = Option("f", "merge", "sum", kind="choice", choices=("sum", "mean"))
    with pytest.raises(ValueError, match="not one of sum, mean"):
        choice.parse("max")
    with pytest.raises(ValueError, match="default"):
        Option("f", "merge", "max", kind="choice", choices=("sum",))
    with pytest.raises(ValueError, match="Unknown option"):
        parse_values((option,), {"ratoi": 1})
    layer = Option("k", "layer k", -2, kind="int")
    assert layer.parse("-3") == -3 and layer.parse(4.0) == 4
    with pytest.raises(ValueError, match="not an integer"):
        layer.parse(1.5)
    assert option.cli_flag("kvcomm") == "--kvcomm-ratio" and Option("x", "x", 1, flag="--x").cli_flag("h") == "--x"


def test_requirements_combine_and_say_why():
    check = all_of(needs_context("needs a context"), lambda pair, request: "second" if "x" in request.query else None)
    assert check(None, HandoffRequest(query="Q?")) == "needs a context"
    assert check(None, HandoffRequest(query="x?", context="C")) == "second"
    assert check(None, HandoffRequest(query="Q?", context="C")) is None


def test_every_registered_descriptor_is_complete():
    names = [handoff.name for handoff in registry.all_handoffs()]
    assert names[:7] == ["receiver", "sharer", "skyline", "text", "c2c", "c2c_control", "kvcomm"]
    for handoff in registry.all_handoffs():
        assert handoff.title and handoff.label and handoff.summary, handoff.name
        assert handoff.color.startswith("#") and callable(handoff.run)
        page = methods.page_of(handoff.name)  # every shipped handoff is a page column with its own copy
        assert page is not None and page.explanation, handoff.name
    assert set(methods.PAGES) == set(names)
    assert [h.name for h in registry.with_role("floor")] == ["receiver"]
    assert [h.name for h in registry.with_role("ceiling")] == ["skyline"]
    with pytest.raises(ValueError, match="Unknown handoff"):
        registry.get("telepathy")
    assert registry.parse_handoffs("all") == names
    with pytest.raises(ValueError, match="no_receiver_prompt"):
        Handoff(name="x", title="x", label="x", color="#000", summary="x", run=print)


def test_the_lists_of_methods_agree_the_modules_their_pages_the_contracts_and_the_catalog():
    """One list of methods: every handoff module has its page module, in the same order; the import
    contracts of both packages name exactly those; every registered handoff is a page column; and
    the catalog the reading and the workshop read (assets/methods.json) is the registry's."""
    import configparser
    from pathlib import Path

    from kvviz import handoffs
    from kvviz.app import methods as pages

    modules = [name.rsplit(".", 1)[1] for name in handoffs.HANDOFF_MODULES]
    assert [name.rsplit(".", 1)[1] for name in pages.PAGE_MODULES] == modules
    contracts = configparser.ConfigParser()
    contracts.read(Path(handoffs.__file__).resolve().parents[2] / ".importlinter")
    for section in ("importlinter:contract:handoffs", "importlinter:contract:app-methods"):
        first = contracts[section]["layers"].strip().splitlines()[0]
        assert sorted(name.strip() for name in first.split("|")) == sorted(modules), section
    assert set(registry.HANDOFFS) == set(methods.PAGES) == set(catalog.names())
    assert catalog.names() == methods.column_names()  # the page order: the page entries' columns
