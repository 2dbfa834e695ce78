"""The performance study's inputs (``kvviz.studies.perf``): synthetic contexts of an exact length in
receiver tokens, with one fact sentence in filler written for this project, and the question about it."""

from __future__ import annotations

from kvviz.core.prompts import build_segments, encode

# Written for this project: neutral filler that says nothing about the fact.
FILLER_SENTENCES = [
    "The morning train left the station a few minutes after the bakery opened its doors.",
    "Several visitors stopped to read the notice about the new opening hours of the museum.",
    "A light rain fell over the hills while the farmers checked the fences along the road.",
    "The committee agreed to meet again next month to review the budget for the school year.",
    "Children played near the fountain as the street musicians tuned their old guitars.",
    "The library added a shelf of travel guides and a quiet corner for reading newspapers.",
    "Engineers inspected the bridge and reported that the repairs would take two more weeks.",
    "In the evening the harbour lights came on one by one along the curved stone pier.",
]
FACT = "The key to the blue storage room is kept in the drawer of the kitchen table."
QUESTION = "Where is the key to the blue storage room kept?"



def synthetic_context(tokenizer, length: int, question: str = QUESTION) -> tuple[str, int]:
    """A context whose prompt segment (what the sender prefills, Skyline's prefix) has ``length`` tokens.

    Filler sentences around one fact sentence in the middle. The left filler is half the token
    budget; the right filler is cut character by character (binary search) until the receiver's
    context segment measures exactly ``length`` tokens. Returns (text, measured length): the
    measured length differs only when no cut reaches ``length`` exactly (then the closest).
    """
    filler_text = " ".join(FILLER_SENTENCES * (length // 100 + 2))
    filler_ids = encode(tokenizer, filler_text)

    def measure(text: str) -> int:
        return len(build_segments(tokenizer, question, text).context_ids)

    base = measure(FACT)
    left_tokens = max(0, (length - base) // 2)
    left = tokenizer.decode(filler_ids[:left_tokens]).strip() if left_tokens else ""
    head = f"{left} {FACT}".strip()

    def build(chars: int) -> tuple[str, int]:
        text = f"{head} {filler_text[:chars]}".strip() if chars else head
        return text, measure(text)

    low, high = 0, len(filler_text)
    while low < high:  # smallest cut whose count reaches the target
        middle = (low + high) // 2
        if build(middle)[1] >= length:
            high = middle
        else:
            low = middle + 1
    best = None
    for chars in [low] + [low + d for d in (-1, 1, -2, 2, -3, 3, 4, 5, 6)]:
        if 0 <= chars <= len(filler_text):
            text, measured = build(chars)
            if measured == length:
                return text, measured
            if best is None or abs(measured - length) < abs(best[1] - length):
                best = (text, measured)
    return best
