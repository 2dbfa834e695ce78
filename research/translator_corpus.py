"""The KV translator's training text: generated private-context facts plus text from ../shared/data.

    python research/translator_corpus.py --out DATA/corpus [--generated 24000]

Writes ``corpus.jsonl`` (one text per line: id, source, split, text) and ``summary.json``.
``split`` is ``fit`` (stage 1 fits on these) or ``check`` (a seeded 3% of the same kinds of text,
never fitted: held-out R^2 on text like the training text).

Held-out entities stay out: generated facts draw names, towns, pets, landmarks, codes, lockers,
times, ages, colours, jobs, objects and rooms from ``kvviz.recall``'s *train* pools only, and
every 4-digit number comes from the train codes; Countries records are split as the evaluators
split them (``load_dataset("countries", seed=0)``: the first 100 are held out, and no landmark of
theirs appears here); every text that contains a held-out first name, last name, town, pet name,
landmark or Countries held-out landmark as a word, or a held-out who-is-where landmark or city
(``kvviz.data.whereabouts``) as a phrase, is dropped (counted in ``summary.json``).
HotpotQA, Tipsheets, ARC, MMLU and OpenBookQA's questions are benchmark sets and are not used
(OpenBookQA's fact book is).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.data import DATA_DIR_ENV, DEFAULT_DATA_DIR, load_dataset, recall, whereabouts  # noqa: E402
from kvviz.studies.c2c.translator_sets import countries_split  # noqa: E402

CHECK_SHARE = 0.03
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DOMAINS = ["mail.com", "post.org", "inbox.net", "letters.io", "example.com"]
FILLERS = [
    "The gym closes at nine.", "It rained all morning.", "The office is on the second floor.",
    "Nobody remembers who painted the door.", "The bus was late again.", "Lunch is served at noon.",
    "The printer on the left is broken.", "Bring a coat; it gets cold.", "The shop sells fresh bread.",
    "The library is quiet in the afternoon.", "There is a small park behind the station.",
    "The lift is out of order this week.", "Tickets can be bought at the kiosk.",
]


def heldout_words() -> set[str]:
    """Words that must not appear in training text: the held-out split's made-up entities."""
    p = recall.pools("heldout")
    words = set()
    for person in p.people:
        words.update(person.split())
    words.update(p.towns)
    words.update(p.pets)
    words.update(landmark.split()[0] for landmark in p.landmarks)
    return words


class Facts:
    """Random facts from the train pools (one rng: reproducible)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.p = recall.pools("train")
        held_codes = set(recall.pools("heldout").codes)
        self.years = [y for y in range(1890, 2030) if y not in held_codes]

    def code(self) -> str:
        return str(self.rng.choice(self.p.codes))

    def date(self) -> str:
        r = self.rng
        return f"{r.choice(MONTHS)} {r.randint(1, 28)}, {r.choice(self.years)}"

    def phone(self) -> str:
        return f"{self.rng.randint(200, 989)}-{self.code()}"

    def plate(self) -> str:
        r = self.rng
        return "".join(r.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(2)) + "-" + self.code()

    def price(self) -> str:
        return f"${self.rng.randint(2, 950)}.{self.rng.randint(0, 99):02d}"

    def fact(self) -> str:
        r, p = self.rng, self.p
        person = r.choice(p.people)
        first = person.split()[0]
        other = r.choice(p.people)
        town = r.choice(p.towns)
        kind = r.randrange(24)
        species = r.choice(recall.SPECIES)
        job = r.choice(p.jobs)
        return [
            lambda: f"{person} lives in {town}.",
            lambda: f"{person} works as {recall.article(job)} {job}.",
            lambda: f"{person}'s favourite colour is {r.choice(p.colours)}.",
            lambda: f"{person} is {r.choice(p.ages)} years old.",
            lambda: f"{person} has {recall.article(species)} {species} called {r.choice(p.pets)}.",
            lambda: f"{person}'s {r.choice(p.objects)} is in the {r.choice(p.rooms)}.",
            lambda: f"{person} is at the {r.choice(p.landmarks)}.",
            lambda: f"The code for locker {r.choice(p.lockers)} is {self.code()}.",
            lambda: f"Locker {r.choice(p.lockers)} opens with the code {self.code()}.",
            lambda: f"The train to {town} leaves at {r.choice(p.times)}.",
            lambda: f"The bus to {town} departs from stop {r.randint(1, 40)} at {r.choice(p.times)}.",
            lambda: f"{person} was born on {self.date()}.",
            lambda: f"{first}'s phone number is {self.phone()}.",
            lambda: f"{person}'s email address is {first.lower()}.{person.split()[-1].lower()}@{r.choice(DOMAINS)}.",
            lambda: f"{person} meets {other} at the {r.choice(p.landmarks)} on {r.choice(WEEKDAYS)} at {r.choice(p.times)}.",
            lambda: f"{person} owes {other} {self.price()}.",
            lambda: f"Flight {r.choice('ABCDEFGHKLMNPRSTUVWZ')}{r.choice('ABCDEFGHKLMNPRSTUVWZ')} {self.code()} to {town} leaves from gate {r.randint(1, 60)} at {r.choice(p.times)}.",
            lambda: f"{person} drives a {r.choice(p.colours)} car with the plate {self.plate()}.",
            lambda: f"The PIN of {first}'s card is {self.code()}.",
            lambda: f"{person} stays in room {r.randint(1, 9)}{r.randint(0, 3)}{r.randint(1, 9)} at the {r.choice(p.landmarks)}.",
            lambda: f"The meeting about the {r.choice(p.landmarks)} is on {self.date()} at {r.choice(p.times)}.",
            lambda: f"{person} moved from {town} to {r.choice(p.towns)} in {r.choice(self.years)}.",
            lambda: f"Order {self.code()} for {person} costs {self.price()} and ships to {town}.",
            lambda: f"{person} keeps the {r.choice(p.objects)} in the {r.choice(p.rooms)} of the house in {town}.",
        ][kind]()

    def passage(self) -> str:
        r = self.rng
        facts = [self.fact() for _ in range(r.choice((1, 1, 2, 2, 3, 3, 4, 5, 6)))]
        if r.random() < 0.35:
            facts.insert(r.randrange(len(facts) + 1), r.choice(FILLERS))
        return " ".join(f for f in facts if f)


def chunks(text: str, limit: int = 700) -> list[str]:
    """Long text cut at sentence ends into pieces of at most ~``limit`` characters."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return [text] if text else []
    sentences = re.split(r"(?<=[.!?])\s+", text)
    out, current = [], ""
    for sentence in sentences:
        if current and len(current) + len(sentence) + 1 > limit:
            out.append(current)
            current = ""
        current = f"{current} {sentence}".strip()[: limit * 2]
    if current:
        out.append(current)
    return out


def build(generated: int, seed: int) -> tuple[list[dict], dict]:
    rng = random.Random(seed)
    texts: list[tuple[str, str]] = []
    facts = Facts(rng)
    texts += [("generated", facts.passage()) for _ in range(generated)]
    for k in range(4):
        texts += [("recall-train", r.context) for r in recall.generate("train", 3000, seed=100 + k)]
    texts += [("whereabouts-train", r.context) for r in whereabouts.generate("train", 3000, seed=100, cities=0.3)]
    countries_train, _ = countries_split()
    for r in countries_train:
        texts.append(("countries-train", r.context))
        texts.append(("countries-train", f"{r.context} {facts.fact()}"))
    for r in load_dataset("dolly"):
        for piece in chunks(r.context or "") + chunks(r.response or ""):
            texts.append(("dolly", piece))
    for r in load_dataset("instructions"):
        texts.append(("instructions", " ".join(x for x in (r.question, r.context or "", r.response or "") if x)))
    book = Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR) / "openbookqa" / "openbook.txt"
    facts_book = [line.strip().strip('"') + "." for line in book.read_text().splitlines() if line.strip()]
    for i in range(0, len(facts_book), 4):
        texts.append(("openbook", " ".join(facts_book[i : i + 4])))

    banned = heldout_words()
    _, countries_held = countries_split()
    banned_phrases = [r.meta["landmark"] for r in countries_held if r.meta.get("landmark")]
    banned_phrases += whereabouts.place_words("heldout")  # the who-is-where held-out landmarks and cities
    rows, dropped, seen = [], {}, set()
    for index, (source, text) in enumerate(texts):
        text = text.strip()
        if not text or text in seen:
            continue
        words = set(re.findall(r"[A-Za-z]+", text))
        if words & banned or any(phrase in text for phrase in banned_phrases):
            dropped[source] = dropped.get(source, 0) + 1
            continue
        seen.add(text)
        digest = int(hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()[:8], 16)
        split = "check" if digest % 1000 < CHECK_SHARE * 1000 else "fit"
        rows.append({"id": f"{source}-{index}", "source": source, "split": split, "text": text})
    rng.shuffle(rows)
    counts = {}
    for row in rows:
        counts.setdefault(row["source"], {"fit": 0, "check": 0})[row["split"]] += 1
    return rows, {"texts": len(rows), "by_source": counts, "dropped_for_heldout_words": dropped, "seed": seed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--generated", type=int, default=24000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, summary = build(args.generated, args.seed)
    with (out / "corpus.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    summary["command"] = f"python research/translator_corpus.py --out {args.out} --generated {args.generated} --seed {args.seed}"
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
