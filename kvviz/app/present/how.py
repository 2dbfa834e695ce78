"""The "How it works" tab: an introduction, each handoff's diagram and explanation, and the words
the page uses before it explains them (project text only: the descriptors and their flows)."""

from __future__ import annotations

import html

from kvviz.app.methods import registry as methods
from kvviz.handoffs import registry


def how_it_works_markdown(name: str) -> str:
    """A handoff's explanation and what it needs."""
    handoff = registry.get(name)
    text = methods.page_of(name).explanation
    if handoff.needs:
        text += "\n\n*Needs:* " + "; ".join(handoff.needs) + "."
    return text


HOW_INTRO = (
    "One question, several ways for a *sharer* model to help a *receiver* model answer it. Text and C2C go from "
    "the pair's sharer to its receiver; KVComm needs a sender of the receiver's own shape, so its sender is a "
    "second copy of the receiver's model. Open a handoff to read how it works."
)


# Every term the page uses before it explains it: How it works ends with them, the setup line hovers one.
GLOSSARY = {
    "KV cache": "the keys and values a model computes for every token it has read, per layer: what its attention reads "
                "later. Handing it over lets the receiver attend to text it never read.",
    "layer": "one of the model's stacked blocks (attention, then a small network); Gemma-3-270M has 18.",
    "control": "the same handoff with the note's content taken out: what the receiver answers anyway. A right answer "
               "whose control is right too is no evidence that the note crossed.",
    "swapped note": "the same note with its answer-bearing fact changed: an answer that follows it came from the note.",
    "logit lens": "the receiver's own output head read after each layer: how likely the answer's first token is there.",
    "attention sink": "the first token, which attention heads look at when they look at nothing in particular; left "
                      "out of the per-token sums.",
    "nats": "log-probability in natural-log units; +1 nat per token makes each answer token e (2.7) times likelier.",
    "softmax": "turns a model's scores into probabilities that sum to one.",
    "Spearman": "a rank correlation, from -1 to 1: whether two orderings agree.",
}


def glossary_markdown() -> str:
    return "**Words used on this page**\n\n" + "\n".join(f"- **{term}**: {meaning}" for term, meaning in GLOSSARY.items())


def how_it_works_page(names: list[str]) -> str:
    """The "How it works" tab: an introduction, then one folded section per handoff with its
    diagram and explanation (project text only: the descriptors and their flows)."""
    sections = [HOW_INTRO]
    for name in names:
        sections.append(f'<details id="kv-how-{name}"><summary><b>{html.escape(registry.get(name).title)}</b></summary>\n\n'
                        f"{diagram_html(name)}\n\n{how_it_works_markdown(name)}\n\n</details>")
    return "\n\n".join(sections + [glossary_markdown()])


def diagram_html(name: str) -> str:
    return f'<div class="kv-diagram">{methods.page_of(name).diagram()}</div>'
