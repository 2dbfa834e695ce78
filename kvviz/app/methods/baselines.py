"""The single-model baselines on the page: the receiver alone, the sharer alone, and Skyline."""

from __future__ import annotations

from kvviz.app.methods.diagram import Flow
from kvviz.app.methods.registry import MethodPage

PAGES = (
    MethodPage(
        name="receiver",
        flow=Flow(sender="", crosses="nothing", receiver="the question alone"),
        column=0,
        explanation=(
            "The receiver model answers the question by itself. Nothing comes from the other model, so "
            "this is the floor: any handoff worth having should beat it."
        ),
        walkthrough=(
            "Look at the grey column. The receiver never saw the note, so it can only guess. The tab *What each "
            "model saw* shows its prompt: the question and nothing else."
        ),
    ),
    MethodPage(
        name="sharer",
        flow=Flow(sender="the note and the question; its own answer is the column's", crosses="nothing: it answers itself", receiver="not used"),
        column=90,
        explanation=(
            "The sharer answers by itself, with the private context it holds. Not a handoff: it shows what "
            "the sharer knows, so you can tell whether a handoff's failure is the sharer's or the trip's."
        ),
    ),
    MethodPage(
        name="skyline",
        flow=Flow(sender="", crosses="nothing: the note is in the receiver's own prompt", receiver="the note and the question in one prompt"),
        column=50,
        explanation=(
            "The receiver gets the context and the question in one prompt, as if it knew everything itself. "
            "It is the usual reference, not a bound: a handoff can beat it (in the KVComm paper, KVComm beat "
            "Skyline on one dataset), because another model's cache can help more than the receiver's own reading."
        ),
        walkthrough=(
            "Skyline (purple) gives the receiver the note directly, in its own prompt. It is the reference the "
            "papers compare with, not a limit and not always right: a handoff may do better or worse, and on "
            "the preset *Where is Kofi?* Skyline itself is wrong."
        ),
    ),
)
