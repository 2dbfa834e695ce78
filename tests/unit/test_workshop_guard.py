"""The workshop's guard and join address without a server: the one line a bad body gets, where a
phone joins, and what a spreadsheet reads from the CSV (the real server's suites are
tests/integration/test_workshop_hostile.py, _flood.py and _race.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvviz.app.workshop import bodies, guard, joining
from kvviz.store.values import projector_key, spreadsheet_cell


def line_for(model, **fields) -> str:
    with pytest.raises(ValidationError) as raised:
        model(**fields)
    return guard.validation_line([{**error, "loc": ("body", *error["loc"])} for error in raised.value.errors()])


def test_a_body_that_does_not_fit_gets_one_line_that_repeats_nothing_it_was_sent():
    assert line_for(bodies.Join, code="ABC", name="y" * 500) == "The name is 500 characters; the limit is 24."
    assert "surrogate" in line_for(bodies.Join, code="AB\ud800", name="Bo")
    assert line_for(bodies.Join, code=7, name="Bo") == "code: Input should be a valid string."
    assert line_for(bodies.Join, code="A", name="B", **{"secret\u202e<x>": 1}) == "This request holds a field it does not take."
    assert line_for(bodies.Join, code="A") == "The field 'name' is missing."
    assert guard.validation_line([{"type": "json_invalid", "loc": ("body", 7), "msg": "JSON decode error",
                                   "ctx": {"error": "Expecting value"}}]) == "The body is not valid JSON (Expecting value, at character 7)."
    assert guard.validation_line([{"type": "missing", "loc": ("body",), "msg": "Field required"}]) == \
        "This request needs a JSON object as its body."
    assert bodies.Predict(exercise=" x ", value="a\x00\u202eb").value == "ab"


@pytest.mark.parametrize("cell, shown", [("=1+1", "'=1+1"), ("+cmd", "'+cmd"), ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"),
                                         ("\tx", "'\tx"), ("\rx", "'\rx"), ("-3", "-3"), ("+0.5", "+0.5"), ("4471", "4471"),
                                         ("Lisbon", "Lisbon")])
def test_a_csv_cell_that_would_start_a_formula_is_quoted_and_a_plain_number_is_not(cell, shown):
    assert spreadsheet_cell(cell) == shown


def test_the_projector_key_is_read_only_and_not_the_token():
    key = projector_key("the-host-token", "ABC234")
    assert key == projector_key("the-host-token", "ABC234") != projector_key("the-host-token", "XYZ234")
    assert "the-host-token" not in key and len(key) == 24


def test_phones_join_where_they_can_reach_the_server(monkeypatch):
    monkeypatch.delenv(joining.JOIN_URL_ENV, raising=False)
    monkeypatch.setattr(joining, "network_address", lambda: "192.168.1.20")
    on_loopback = joining.join_address("127.0.0.1", "127.0.0.1:7860")
    assert on_loopback.base == "http://127.0.0.1:7860" and "--host 0.0.0.0" in on_loopback.warning
    everywhere = joining.join_address("0.0.0.0", "localhost:7860")
    assert (everywhere.base, everywhere.warning, everywhere.shown()) == ("http://192.168.1.20:7860", "", "192.168.1.20:7860/workshop")
    assert joining.join_address("0.0.0.0", "kvviz.school.lan:8080").url("ABC234") == "http://kvviz.school.lan:8080/workshop/class/ABC234"
    assert joining.join_address("127.0.0.1", "[::1]:7860").warning
    monkeypatch.setattr(joining, "network_address", lambda: None)
    assert "KVVIZ_JOIN_URL" in joining.join_address("0.0.0.0", "127.0.0.1:7860").warning
    monkeypatch.setenv(joining.JOIN_URL_ENV, "https://class.example.org/")
    assert joining.join_address("127.0.0.1", "127.0.0.1:7860") == joining.JoinAddress("https://class.example.org")


def test_the_qr_code_is_an_svg_of_the_join_address():
    svg = joining.qr_svg("http://192.168.1.20:7860/workshop/class/ABC234").decode()
    assert svg.startswith("<?xml") and "<svg" in svg and "ABC234" in svg


def test_public_mode_takes_less_of_everything_and_each_client_less():
    from dataclasses import fields

    from limits import parse_many

    from kvviz.core.policy import LOCAL_WORKSHOP, PUBLIC_WORKSHOP

    for field in fields(LOCAL_WORKSHOP):
        local, public = getattr(LOCAL_WORKSHOP, field.name), getattr(PUBLIC_WORKSHOP, field.name)
        if isinstance(local, str):  # an allowance: each of its windows allows fewer
            assert all(p.amount < l.amount for p, l in zip(parse_many(public), parse_many(local))), field.name
        elif field.name not in ("host_lease_seconds", "idle_class_minutes"):
            assert public < local, field.name
