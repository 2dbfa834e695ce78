"""A pair's models and their architecture facts, without loading weights: the loaded model's facts
when this process has it, else the converted folder's config.json."""

from __future__ import annotations

import functools
import json

from kvviz.app.present.text import md
from kvviz.core.facts import facts_from_config
from kvviz.runtime import models
from kvviz.runtime.models import EMBEDDED_MODELS, resolve_pair


@functools.lru_cache(maxsize=32)
def model_facts_row(name: str) -> dict:
    """Architecture facts of a model without loading its weights or its (large) tokenizer: the
    loaded model's facts when this process has it, else the converted folder's config.json."""
    loaded = models.loaded_facts(name)
    if loaded is not None:
        return loaded.to_dict()
    if name not in EMBEDDED_MODELS:
        return {"status": "loads from the Hugging Face hub when run (needs network or a warm hub cache)"}
    if not models.is_prepared(name):
        return {"status": "not prepared yet: python -m kvviz prepare (or the first run converts it)"}
    from transformers import AutoConfig

    folder = models.converted_dir(name)
    facts = facts_from_config(name, AutoConfig.from_pretrained(folder)).to_dict()
    template = (folder / "chat_template.jinja").exists()
    try:
        template = template or "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        pass
    facts["has_chat_template"] = template
    return facts


def pair_facts_markdown(pair_name: str) -> str:
    """The pair's models and their architecture facts, without loading weights."""
    try:
        spec = resolve_pair(pair_name)
    except ValueError as error:
        return f"**{md(error)}**"
    roles = [("sharer", spec.sharer), ("receiver", spec.receiver)]
    if spec.same_shape_sender_name != spec.sharer:
        roles.append(("same-shape sender", spec.same_shape_sender_name))
    lines = [
        md(spec.description),
        "",
        "| role | model | architecture | layers | hidden | heads | KV heads | head dim | vocabulary | chat template |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for role, name in roles:
        try:
            row = model_facts_row(name)
        except Exception as error:  # a listing must not break the page
            row = {"status": f"unavailable ({type(error).__name__}: {error})"}
        if "num_layers" in row:
            lines.append(
                f"| {role} | {md(name)} | {md(row['architecture'])} | {row['num_layers']} | {row['hidden_size']} | "
                f"{row['num_heads']} | {row['num_kv_heads']} | {row['head_dim']} | {row['vocab_size']:,} | "
                f"{'yes' if row['has_chat_template'] else 'no'} |"
            )
        else:
            lines.append(f"| {role} | {md(name)} | {md(row.get('status', '?'))} | | | | | | | |")
    if spec.needs_network:
        lines.append("\nThis pair needs network access (or models already in the hub cache).")
    return "\n".join(lines)
