"""What the KV translator is trained on through the receiver: notes the sharer reads, and the text
that follows them for the receiver (``kvviz.studies.c2c.translator_train``'s receiver-side loss).

Each ``Note`` is a context only the sharer reads and a target the receiver is scored on after the
translated context: either the note's own **continuation** (generic text cut at a sentence end:
the receiver reads on where the note stops), or a **question** and its answer. Kinds, mixed in
the shares ``MIX`` gives (``mixture``):

* ``continue``: text both tokenizers read (Dolly's contexts and responses, the instruction set,
  OpenBookQA's fact book), its continuation as the target;
* ``whereabouts``: who-is-where notes of the *train* split (``kvviz.data.whereabouts``: one to three
  people at well-known landmarks or cities), asked for the country, which the note does not say:
  the receiver's own knowledge, reached through the translated KV;
* ``unneeded``: the same notes with a question they do not answer (the country of a train landmark
  not in the note): the receiver must answer from what it knows, undisturbed by the note;
* ``who``: who is at a landmark of the note (two or three people: which name goes with which place);
* ``recall``: ``kvviz.data.recall``'s train records (exact values: codes, names, times);
* ``countries``: KVComm's Countries outside the evaluators' 100;
* ``dolly``: Dolly records with an input (the instruction asked, the response's first tokens);
* ``passage``: paragraphs (HotpotQA's distractor paragraphs, Dolly's passages), read on from;
* ``passage_qa``: Dolly's passages asked their question (``kvviz.data.passages``: the extractive ones
  are validation passages, never trained on);
* ``mismatched``: a question of another kind over *another* note's context (the harm guard: a note
  that does not hold the answer must not make the answer worse than the receiver alone's).

With ``twins`` every who-is-where, recall and Countries note comes with its **swap twin**
(``kvviz.data.swaps``: the same note with its answer-bearing fact changed, and its answer), so
that one step asks the translator for each note's own answer (the follow objective,
``kvviz.studies.c2c.translator_train.FollowLoss``).

Nothing held out enters: texts naming a held-out who-is-where landmark or city, a held-out
Countries landmark or a held-out recall name, town, pet or landmark are left out, and the generated
notes draw from the train splits only; HotpotQA's supporting paragraphs (the held-out passages)
never appear. The same (count, seed, mix) give the same notes in the same
order, so a training run resumes by its position in the list.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

from kvviz.core.prompts import build_segments
from kvviz.data import load_dataset, passages, recall, whereabouts
from kvviz.data.files import dataset_path
from kvviz.data.swaps import SWAPPERS
from kvviz.studies.c2c.examples import response_ids

# issue 31's mixture (one-line notes); runs that name no mix read FOLLOW_MIX
MIX = {"continue": 0.35, "whereabouts": 0.24, "unneeded": 0.07, "who": 0.04, "recall": 0.12, "countries": 0.04, "dolly": 0.14,
       "passage": 0.0, "passage_qa": 0.0, "mismatched": 0.0}
# issue 43's: passages beside the notes, and mismatched notes for the harm guard
FOLLOW_MIX = {"continue": 0.14, "whereabouts": 0.18, "unneeded": 0.06, "who": 0.03, "recall": 0.12, "countries": 0.04,
              "dolly": 0.05, "passage": 0.12, "passage_qa": 0.12, "mismatched": 0.14}
TWIN_KINDS = ("whereabouts", "recall", "countries")  # kinds whose notes have a swap twin
MISMATCH_SOURCES = ("whereabouts", "recall", "dolly", "passage_qa")  # questions asked over another note
ANSWER_TOKENS = 16  # a question's target: the answer's first tokens
CONTINUATION_TOKENS = 24  # a continuation's target
MAX_NOTE_CHARACTERS = 480
MAX_PASSAGE_CHARACTERS = 1200


@dataclass(frozen=True)
class Note:
    """A context only the sharer reads, and what the receiver is scored on after it: the answer to
    ``question``, or with ``question`` None the text that follows the note."""

    kind: str
    context: str
    question: str | None
    target: str
    twin: Note | None = None  # the same note with its answer-bearing fact swapped, and its answer


def target_ids(tokenizer, note: Note) -> tuple[list[int], list[int]]:
    """(what the receiver reads after the translated context, the tokens it is scored on). A question:
    its query segment (``kvviz.core.prompts``), then the answer as the receiver would write it. A
    continuation: the text's first token is read, the next ``CONTINUATION_TOKENS`` are scored."""
    if note.question is not None:
        return build_segments(tokenizer, note.question).query_ids, response_ids(tokenizer, note.target, ANSWER_TOKENS)
    ids = tokenizer(note.target, add_special_tokens=False)["input_ids"][: CONTINUATION_TOKENS + 1]
    return ids[:1], ids[1:]


def heldout_filter():
    """A function text -> True when the text names nothing held out (see the module docstring)."""
    words = whereabouts.recall_words("heldout") - set(recall.LANDMARK_KINDS)
    words |= set(whereabouts.first_names("heldout"))
    phrases = whereabouts.place_words("heldout")
    phrases += [r.meta["landmark"] for r in load_dataset("countries", seed=0)[:100] if r.meta.get("landmark")]
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(p)}(?!\w)" for p in sorted(set(phrases), key=len, reverse=True)))

    def allowed(text: str) -> bool:
        return not (set(re.findall(r"[A-Za-z]+", text)) & words) and not pattern.search(text)

    return allowed


def split_continuation(text: str, rng: random.Random, longest: int = MAX_NOTE_CHARACTERS) -> tuple[str, str] | None:
    """(note, continuation): ``text`` cut at a sentence end (or, for one long sentence, at a word),
    the note at most ``longest`` characters; None when too short to cut."""
    text = " ".join(text.split())
    sentences = re.split(r"(?<=[.!?])\s+", text)
    if len(sentences) >= 2:
        cut = rng.randint(1, len(sentences) - 1)
        while cut > 1 and len(" ".join(sentences[:cut])) > longest:
            cut -= 1
        note, rest = " ".join(sentences[:cut]), " ".join(sentences[cut:])
    else:
        words = text.split()
        if len(words) < 12:
            return None
        cut = rng.randint(len(words) // 2, len(words) - 4)
        note, rest = " ".join(words[:cut]), " ".join(words[cut:])
    if len(note) > longest or len(note) < 20 or len(rest) < 10:
        return None
    return note, rest


def generic_texts() -> list[str]:
    """Dolly (contexts and responses), the instruction set (instruction, input and output) and
    OpenBookQA's fact book (four facts per text)."""
    texts = []
    held = validation_passages()
    for record in load_dataset("dolly"):
        if record.context not in held:
            texts += [t for t in (record.context, record.response) if t and len(t) > 40]
    for record in load_dataset("instructions"):
        texts.append(" ".join(x for x in (record.question, record.context or "", record.response or "") if x))
    book = dataset_path(None, "openbookqa", "openbook.txt").read_text().splitlines()
    facts = [line.strip().strip('"').rstrip(".") + "." for line in book if line.strip()]
    texts += [" ".join(facts[i:i + 4]) for i in range(0, len(facts), 4)]
    return texts


def with_twins(kind: str, records, notes: list[Note], seed: int) -> list[Note]:
    """``notes`` (one per record, in order) each with its swap twin where ``kvviz.data.swaps`` has one."""
    swaps = SWAPPERS[kind](records, seed)
    out = []
    for record, note in zip(records, notes):
        swap = swaps.get(record.id)
        twin = None if swap is None else Note(note.kind, swap.context, note.question, swap.answers[0])
        out.append(dataclasses.replace(note, twin=twin))
    return out


def _whereabouts_notes(n: int, seed: int, kind: str, rng: random.Random, twins: bool) -> list[Note]:
    records = whereabouts.generate("train", n, seed=seed, people=(1, 2, 3) if kind != "who" else (2, 3), cities=0.3)
    landmarks = whereabouts.places("landmark", "train")
    notes = []
    for record in records:
        if kind == "whereabouts":
            notes.append(Note(kind, record.context, record.question, record.meta["country"]))
        elif kind == "who":
            if record.meta["landmark"] in dict(whereabouts.CITIES):
                continue
            notes.append(Note(kind, record.context, f"Who is at {record.meta['landmark']}?", record.meta["person"]))
        else:
            place, country = rng.choice([p for p in landmarks if p[0] not in record.context])
            notes.append(Note(kind, record.context, f"Which country is {place} in?", country))
    if twins and kind == "whereabouts":
        notes = with_twins(kind, records, notes, seed)
    return notes


def _record_notes(kind: str, n: int, seed: int, twins: bool) -> list[Note]:
    if kind == "recall":
        records = recall.generate("train", n, seed=300 + seed)
    elif kind == "countries":
        records = load_dataset("countries", seed=0)[100:]  # the evaluators' first 100 are held out
    elif kind == "passage_qa":
        records = dolly_training_passages(seed)
    else:
        held = validation_passages()
        records = [r for r in load_dataset("dolly", seed=seed)
                   if r.context and r.response and len(r.context) <= MAX_NOTE_CHARACTERS and r.context not in held]
    records = records[:n]
    notes = [Note(kind, r.context, r.question, r.response or r.answers[0]) for r in records]
    return with_twins(kind, records, notes, seed) if twins and kind in TWIN_KINDS else notes


def validation_passages() -> set[str]:
    """The passages a run is validated on (Dolly's extractive ones): no kind reads them."""
    return {r.context for r in passages.dolly_passages()[1]}


def dolly_training_passages(seed: int):
    """Dolly's passages a run may train on (``kvviz.data.passages``), shuffled with ``seed``."""
    training, _ = passages.dolly_passages()
    training = list(training)
    random.Random(f"dolly-passages-{seed}").shuffle(training)
    return training


def passage_texts(seed: int) -> list[str]:
    """Paragraphs read on from: HotpotQA's distractor paragraphs and Dolly's training passages."""
    return passages.training_paragraphs() + [r.context for r in dolly_training_passages(seed)]


def mismatched(pool: list[Note], wanted: int, rng: random.Random) -> list[Note]:
    """``wanted`` questions of ``pool`` each asked over another note's context (never one with the
    same answer in it): the harm guard's notes."""
    out = []
    for _ in range(wanted * 4):
        if len(out) == wanted:
            break
        asked, other = rng.sample(pool, 2)
        if other.context == asked.context or asked.target.lower() in other.context.lower():
            continue
        out.append(Note("mismatched", other.context, asked.question, asked.target))
    return out


def _pool(kind: str, wanted: int, seed: int, rng: random.Random, allowed, twins: bool) -> list[Note]:
    if kind in ("continue", "passage"):
        texts = [t for t in (generic_texts() if kind == "continue" else passage_texts(seed)) if allowed(t)]
        rng.shuffle(texts)
        longest = MAX_NOTE_CHARACTERS if kind == "continue" else MAX_PASSAGE_CHARACTERS
        pairs = [split_continuation(t, rng, longest) for t in texts]
        return [Note(kind, note, None, rest) for note, rest in filter(None, pairs)]
    if kind in ("whereabouts", "unneeded", "who"):
        return _whereabouts_notes(wanted + 16, seed, kind, rng, twins)
    return [n for n in _record_notes(kind, wanted, seed, twins) if allowed(n.context)]


def mixture(count: int, seed: int = 0, mix: dict | None = None, twins: bool = False) -> list[Note]:
    """``count`` training notes in the shares of ``mix`` (``MIX`` by default), shuffled with ``seed``;
    a kind with fewer notes than its share repeats them. ``twins``: who-is-where, recall and
    Countries notes carry their swap twin. Reproducible from the arguments."""
    mix = MIX if mix is None else mix
    unknown = set(mix) - set(MIX)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}; the mixture has {', '.join(MIX)}")
    rng = random.Random(f"translator-mixture-{seed}")
    allowed = heldout_filter()
    total = sum(mix.values())
    notes = []
    for kind, share in mix.items():
        wanted = round(count * share / total)
        if wanted == 0:
            continue
        if kind == "mismatched":
            sources = [n for k in MISMATCH_SOURCES for n in _pool(k, max(wanted // 2, 50), seed, rng, allowed, False)]
            pool = mismatched(sources, wanted, rng)
        else:
            pool = _pool(kind, wanted, seed, rng, allowed, twins)
        notes += [pool[i % len(pool)] for i in range(wanted)]
    rng.shuffle(notes)
    return notes[:count]
