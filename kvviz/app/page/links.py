"""The page's state in a link: "Copy link" writes the address bar's query string from the page's
fields, and opening such a link reads it back (a bad value is left out, never an error). No Gradio.
"""

from __future__ import annotations

from urllib.parse import urlencode

from kvviz.app.page.spec import PageOption, column_names, expected_text
from kvviz.app.presets import preset
from kvviz.handoffs.registry import Option

# The page's state in a URL's query string: the form's fields by these names, each handoff option as
# "o.HANDOFF.OPTION" (and "o.HANDOFF.OPTION.auto" for its "auto" checkbox). A preset's key names its
# question and precomputed results; "q" and "c" are there only when they differ from the preset's.
LINK_FIELDS = ("pair", "preset", "q", "c", "h", "expected", "max_new_tokens", "sample", "temperature", "seed", "tab",
               "column")


def option_link_names(specs: list[PageOption]) -> list[str]:
    """The link names of the option widgets, in ``Page.option_inputs`` order."""
    names = []
    for option in specs:
        base = f"o.{option.handoff.name}.{option.option.name}"
        names += [f"{base}.auto", base] if option.option.auto else [base]
    return names


def link_text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def permalink_query(specs: list[PageOption], state: dict) -> str:
    """``state`` (the fields by link name, option values under "options" in widget order) as a
    query string, without the fields a preset already gives."""
    picked = preset(state["preset"]) if state.get("preset") else None
    fields = {name: state.get(name) for name in LINK_FIELDS}
    if picked is not None and (fields.get("q") or "") == picked.query and (fields.get("c") or "") == (picked.context or ""):
        fields.pop("q"), fields.pop("c")
    if picked is not None and fields.get("expected") == expected_text(picked.answers):
        fields.pop("expected")
    fields["h"] = ",".join(state.get("h") or [])
    fields.update(zip(option_link_names(specs), state.get("options") or []))
    return urlencode({name: link_text(value) for name, value in fields.items() if value is not None})


def permalink_state(specs: list[PageOption], params: dict) -> dict:
    """A URL's query parameters back into page values: ``{field: value}`` for the fields given
    (types as the widgets take them; unknown or malformed values are left out), option values as
    ``{"options": {index: value}}``. A ValueError never escapes: a bad link opens the page as usual."""
    out: dict = {}
    for name in ("pair", "q", "c", "expected", "tab", "column"):
        if params.get(name) is not None:
            out[name] = str(params[name])
    if params.get("preset"):
        try:
            out["preset"] = preset(str(params["preset"])).key
        except (KeyError, ValueError):
            pass
    if params.get("h") is not None:
        out["h"] = [name for name in str(params["h"]).split(",") if name in column_names()]
    for name, kind in (("max_new_tokens", int), ("temperature", float), ("seed", int)):
        try:
            out[name] = kind(float(params[name])) if kind is int else kind(params[name])
        except (KeyError, TypeError, ValueError):
            pass
    if params.get("sample") is not None:
        out["sample"] = str(params["sample"]) in ("1", "true", "True")
    options = {}
    for index, (name, option) in enumerate(zip(option_link_names(specs), _widget_options(specs))):
        if name not in params:
            continue
        text = str(params[name])
        try:
            if name.endswith(".auto"):
                options[index] = text in ("1", "true", "True")
            elif option.kind == "int":
                options[index] = int(float(text))
            elif option.kind == "float":
                options[index] = float(text)
            else:
                options[index] = text
        except ValueError:
            continue
    if options:
        out["options"] = options
    return out


def _widget_options(specs: list[PageOption]) -> list[Option]:
    """The option behind each widget, in ``Page.option_inputs`` order."""
    return [option.option for option in specs for _ in range(option.inputs)]
