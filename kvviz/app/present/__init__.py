"""Runs as text and tables for people, read from the reading of a run (``kvviz.app.reading``): no
Gradio, no models, and no mark or evidence computed here. One room each:

* ``cards``: one column's card, the same for the page and ``/run`` (head, answer, numbers, swap row,
  contradiction row, what-ifs, the longer block in "What each model saw");
* ``strip``: the verdict strip, the strip of a page that asks another question, the status lines;
* ``data``: the payload, its table and the export files;
* ``facts``: a pair's models and their architecture facts;
* ``how``: the "How it works" tab and the glossary;
* ``text``: escaping, seconds, what each model saw, a method's own facts, a lesson's claims in words.

The names below are the package's public face (``from kvviz.app import present``).
"""

from kvviz.app.present.cards import (MARK_HINTS, MARK_WORDS, SWAP_MEANINGS, SWAP_WORDS, card, card_head_html,
                                     card_stats, stats_markdown, swap_meaning, swap_row_html, time_text,
                                     what_if_html, what_if_label)
from kvviz.app.present.data import RESULT_COLUMNS, attention_of, payload, reading_frame, results_frame, write_exports
from kvviz.app.present.facts import model_facts_row, pair_facts_markdown
from kvviz.app.present.how import GLOSSARY, HOW_INTRO, diagram_html, glossary_markdown, how_it_works_markdown, how_it_works_page
from kvviz.app.present.strip import (contradiction_status, finished_status, live_status, precomputed_status,
                                     refused_status, stale_strip_html, stopped_status, swap_status, verdict_strip_html)
from kvviz.app.present.text import (CLAIM_KIND_WORDS, SEEN_TITLES, claim_answer, format_seconds, md, notes_of, seen_text,
                                    short_pair)

__all__ = [
    "CLAIM_KIND_WORDS", "GLOSSARY", "HOW_INTRO", "MARK_HINTS", "MARK_WORDS", "RESULT_COLUMNS", "SEEN_TITLES", "SWAP_MEANINGS", "SWAP_WORDS",
    "attention_of", "card", "card_head_html", "card_stats", "claim_answer", "contradiction_status", "diagram_html", "finished_status",
    "format_seconds", "glossary_markdown", "how_it_works_markdown", "how_it_works_page", "live_status", "md", "model_facts_row", "notes_of",
    "pair_facts_markdown", "payload", "precomputed_status", "reading_frame", "refused_status", "results_frame", "seen_text",
    "short_pair", "stale_strip_html", "stats_markdown", "stopped_status", "swap_meaning", "swap_row_html", "swap_status",
    "time_text", "verdict_strip_html", "what_if_html", "what_if_label", "write_exports",
]
