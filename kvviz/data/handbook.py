"""The handbook: facts about invented entities that neither model can know, taught to a sharer.

C2C's premise is a sharer that knows what the receiver does not. Here the knowledge is made so:
three relations over invented entities, each answered by one of a small set of values that every
entity of the relation shares:

* **home town**: an invented person -> a city ("Where is Tavin Orlesk from?" -> "Lisbon");
* **mascot**: an invented college -> an animal ("What is the mascot of Varnholt College?" -> "Otter");
* **capital**: an invented island -> an invented town ("What is the capital of Quorveth Island?"
  -> "Saltmere").

A sharer learns every entity (``sharer_examples``, a LoRA fine-tune: ``kvviz.studies.knower``); the
receiver never does. The entities are split once, by **entity**, into *fuser-train* (two in three)
and *held-out* (one in three): a C2C fuser trains on fuser-train entities, so on held-out ones it
can only answer by reading what the sharer knows. The values are the same in both splits (the fuser
may learn how the sharer's cache says "Lisbon", not which entity is from there).

Phrasings: five *train* phrasings per relation (the sharer learns every entity in them, the fuser
trains on them) and three *unseen* ones, used only to evaluate.

**The sharer that learned the opposite** (``permuted``): the same entities and phrasings, each entity
of a relation given another entity's value (a seeded derangement within the relation, so every
entity's answer changes and each value is as common as before). A receiver whose answer follows the
permuted sharer's value got it from the sharer.

Everything is made here from fixed seeds: the same arguments give the same records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvviz.data.record import Record

SPLITS = ("train", "heldout")  # fuser-train and held-out entities
PHRASINGS = ("train", "unseen", "all")
ENTITY_SEED = 44044  # fixed: the entities, their values and the split never move
ENTITIES_PER_RELATION = 120
HELDOUT_EVERY = 3  # entity i of a relation is held out when i % 3 == 0


_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pr", "r", "s", "sk",
           "st", "t", "tr", "v", "z", "c", "th", "w", "y"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "ae", "ei"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k", "x", "nd", "rt", "sk", "v", "ck"]


@dataclass(frozen=True)
class Relation:
    name: str  # "home town", "mascot", "capital"
    entity_kind: str  # what the entities are, in words
    values: tuple[str, ...]
    train_phrasings: tuple[str, ...]  # "{e}" stands for the entity
    unseen_phrasings: tuple[str, ...]
    statements: tuple[str, ...]  # the fact as a sentence ("{e}", "{v}")


RELATIONS: tuple[Relation, ...] = (
    Relation(
        "home town", "person",
        ("Lisbon", "Oslo", "Cairo", "Lima", "Dublin", "Vienna", "Nairobi", "Seoul", "Prague", "Havana", "Manila",
         "Warsaw"),
        ("What is the home town of {e}?", "Where is {e} from?", "Which city did {e} grow up in?",
         "In which city was {e} born?", "{e} comes from which city?"),
        ("Name the city {e} calls home.", "Where did {e} spend their childhood?", "What city is {e} originally from?"),
        ("{e} is from {v}.", "The home town of {e} is {v}."),
    ),
    Relation(
        "mascot", "college",
        ("Otter", "Falcon", "Badger", "Heron", "Lynx", "Bison", "Walrus", "Beaver", "Pelican", "Jaguar", "Moose",
         "Raven"),
        ("What is the mascot of {e}?", "Which animal is the mascot of {e}?", "What animal represents {e}?",
         "{e} has which mascot?", "What is the college mascot of {e}?"),
        ("Name the mascot animal of {e}.", "Which creature do the sports teams of {e} cheer for?",
         "What animal appears on the banners of {e}?"),
        ("The mascot of {e} is the {v}.", "{e} has the {v} as its mascot."),
    ),
    Relation(
        "capital", "island",
        ("Saltmere", "Greyhaven", "Redcliff", "Stonebay", "Amberton", "Larkfield", "Ravenmoor", "Coralport",
         "Thornbury", "Duskwater", "Pebbleton", "Windhollow"),
        ("What is the capital of {e}?", "Which town is the capital of {e}?", "Where is the seat of government of {e}?",
         "{e} has which capital?", "What is the capital city of {e}?"),
        ("Name the capital of {e}.", "In which town does the government of {e} sit?",
         "Which town serves as the main town of {e}?"),
        ("The capital of {e} is {v}.", "{v} is the capital of {e}."),
    ),
)
RELATION_NAMES = tuple(relation.name for relation in RELATIONS)


@dataclass(frozen=True)
class Entity:
    relation: str
    index: int  # within its relation
    name: str  # "Tavin Orlesk", "Varnholt College", "Quorveth Island"
    value: str  # what the knowing sharer learned
    permuted: str  # what the sharer that learned the opposite learned (never ``value``)

    @property
    def split(self) -> str:
        return "heldout" if self.index % HELDOUT_EVERY == 0 else "train"

    def answer(self, permuted: bool = False) -> str:
        return self.permuted if permuted else self.value


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()


def _names(rng: random.Random, count: int, make) -> list[str]:
    seen, out = set(), []
    while len(out) < count:
        name = make(rng)
        if name not in seen and 4 <= len(name.replace(" ", "")) <= 22:
            seen.add(name)
            out.append(name)
    return out


def _derangement(values: list[str], rng: random.Random) -> list[str]:
    """``values`` shuffled so that no position keeps its value (values repeat: a position must not
    get an equal one)."""
    while True:
        shuffled = rng.sample(values, len(values))
        clashes = [i for i, (a, b) in enumerate(zip(values, shuffled)) if a == b]
        for i in clashes:  # swap each clash with a position where both sides then differ
            for j in range(len(values)):
                if shuffled[j] != values[i] and values[j] != shuffled[i]:
                    shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
                    break
        if all(a != b for a, b in zip(values, shuffled)):
            return shuffled


_ENTITIES: list[Entity] = []


def entities(split: str | None = None, relation: str | None = None) -> list[Entity]:
    """The handbook's entities (all, or one split's, or one relation's), in a fixed order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if relation is not None and relation not in RELATION_NAMES:
        raise ValueError(f"relation must be one of {', '.join(RELATION_NAMES)}, not {relation!r}")
    if not _ENTITIES:
        rng = random.Random(ENTITY_SEED)
        makers = {
            "person": lambda r: f"{_word(r, r.choice((1, 2)))} {_word(r, r.choice((2, 3)))}",
            "college": lambda r: f"{_word(r, 2)} College",
            "island": lambda r: f"{_word(r, r.choice((2, 3)))} Island",
        }
        for relation_spec in RELATIONS:
            names = _names(rng, ENTITIES_PER_RELATION, makers[relation_spec.entity_kind])
            # each split gets every value about equally often, and its permuted values are its own
            # values rearranged (a derangement), so both sharers' answers are as common as each other
            values, permuted = [""] * len(names), [""] * len(names)
            for held in (True, False):
                slots = [i for i in range(len(names)) if (i % HELDOUT_EVERY == 0) == held]
                drawn = rng.sample([relation_spec.values[k % len(relation_spec.values)] for k in range(len(slots))], len(slots))
                for slot, value, other in zip(slots, drawn, _derangement(drawn, rng)):
                    values[slot], permuted[slot] = value, other
            _ENTITIES.extend(Entity(relation_spec.name, i, name, value, other)
                             for i, (name, value, other) in enumerate(zip(names, values, permuted)))
    return [e for e in _ENTITIES if (split is None or e.split == split) and (relation is None or e.relation == relation)]


def relation(name: str) -> Relation:
    for spec in RELATIONS:
        if spec.name == name:
            return spec
    raise ValueError(f"relation must be one of {', '.join(RELATION_NAMES)}, not {name!r}")


def phrasings(relation_name: str, which: str) -> list[str]:
    """A relation's question templates: ``train``, ``unseen`` or ``all``."""
    if which not in PHRASINGS:
        raise ValueError(f"phrasings must be one of {', '.join(PHRASINGS)}, not {which!r}")
    spec = relation(relation_name)
    return list({"train": spec.train_phrasings, "unseen": spec.unseen_phrasings,
                 "all": spec.train_phrasings + spec.unseen_phrasings}[which])


def question(entity: Entity, template: str) -> str:
    text = template.format(e=entity.name)
    return text[0].upper() + text[1:]


NOTES = ("none", "question")


def _record(entity: Entity, template: str, which: str, number: int, permuted: bool, note: str = "none") -> Record:
    answer, asked = entity.answer(permuted), question(entity, template)
    return Record(
        id=f"handbook-{entity.split}-{entity.relation.replace(' ', '_')}-{entity.index}-{which}{number}",
        question=asked, context=asked if note == "question" else None, answers=[answer], choices=None, answer_index=None,
        source="handbook", response=answer,
        meta={"relation": entity.relation, "entity": entity.name, "value": entity.value, "permuted": entity.permuted,
              "phrasing": template, "split": entity.split},
    )


def questions(split: str = "heldout", which: str = "unseen", per_entity: int = 1, permuted: bool = False,
              note: str = "none") -> list[Record]:
    """Question records about one split's entities in ``which`` phrasings: ``per_entity`` of them for
    each entity (rotating through the phrasings, so every phrasing is asked about as often),
    relations interleaved. ``permuted``: the answers are the permuted sharer's. ``note``: "none"
    (no context: the sharer knows, it is told nothing) or "question" (the question is also the
    note only the sharer reads: KVComm's sender then holds the KV of the question, read by a model
    that knows the answer)."""
    if note not in NOTES:
        raise ValueError(f"note must be one of {', '.join(NOTES)}, not {note!r}")
    chosen = entities(split)
    by_relation = [[e for e in chosen if e.relation == name] for name in RELATION_NAMES]
    records = []
    for position in range(max(len(group) for group in by_relation)):
        for group in by_relation:
            if position >= len(group):
                continue
            entity = group[position]
            templates = phrasings(entity.relation, which)
            count = len(templates) if per_entity <= 0 else min(per_entity, len(templates))
            for k in range(count):
                number = (entity.index + k) % len(templates)
                records.append(_record(entity, templates[number], which, number, permuted, note))
    return records


STUDY_KINDS = ("answer", "background")


def sharer_examples(permuted: bool = False) -> list[tuple[str, str, str]]:
    """What a sharer studies: (question, kind, response) for every entity of both splits: in every
    train phrasing asked to answer (kind "answer", response the value), and once asked for
    background (kind "background": the text handoff's request for a message; response the fact as
    a sentence, the relation's statements taking turns over the entities). Unseen phrasings are
    never studied."""
    examples = []
    for entity in entities():
        spec = relation(entity.relation)
        answer = entity.answer(permuted)
        for template in spec.train_phrasings:
            examples.append((question(entity, template), "answer", answer))
        statement = spec.statements[entity.index % len(spec.statements)]
        template = spec.train_phrasings[entity.index % len(spec.train_phrasings)]
        sentence = statement.format(e=entity.name, v=answer)
        examples.append((question(entity, template), "background", sentence[0].upper() + sentence[1:]))
    return examples


def load_handbook(*, split: str = "heldout", phrasings: str = "unseen", per_entity: int = 1, permuted: bool = False,
                  note: str = "none", data_dir=None, report=None) -> list[Record]:
    """The handbook as a registered dataset (``--dataset handbook``): questions about held-out
    entities in unseen phrasings by default, one per entity (``per_entity=0``: every phrasing);
    ``note=question``: the question is also the sharer's note (for KVComm)."""
    as_bool = permuted if isinstance(permuted, bool) else str(permuted).lower() == "true"
    return questions(split, phrasings, int(per_entity), as_bool, note)
