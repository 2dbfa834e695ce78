"""Private-context recall: seeded facts that only the sharer reads, questions the receiver gets.

Each record holds a short context of one to three facts ("The code for locker 12 is 4471.",
"Tavin Orlesk lives in Brindlemoor.", "Mira Tolvan is at the Korvath Abbey.") and a question about one of them; the answer is the fact's
value ("4471", "Brindlemoor"). The receiver cannot guess it: names and towns are made up here from
syllables, codes and times are random. A fuser that lowers the receiver's loss on these answers
has carried the sharer's information.

Split by entity: every pool (people, towns, pets, lockers, codes, times, colours, jobs, objects,
rooms, landmarks) is cut once, with a fixed seed, into a training part and a held-out part, so held-out
records use names **and** values never seen in training. ``generate(split, n, seed)`` draws
records from one part; the same arguments give the same records. No external data: every word
list below is written here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvviz.data.record import Record

SPLITS = ("train", "heldout")
POOL_SEED = 20251  # fixed: the train / held-out cut never moves
HELDOUT_SHARE = 5  # one item in five is held out

ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pr", "r", "s", "sh",
          "st", "t", "tr", "v", "z", "c", "ch", "th", "w", "y", "el", "or", "al"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "ae"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k", "x", "nd", "rt", "sk", "v"]
TOWN_ENDINGS = ["moor", "ford", "by", "ton", "vik", "stead", "wick", "holm", "dale", "mere", "gate", "port", "field",
                "haven", "burg", "croft"]
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "pink", "brown", "black", "white", "grey", "teal",
           "maroon", "navy", "olive", "silver", "gold", "beige", "violet", "turquoise", "crimson", "amber", "indigo",
           "ivory", "coral", "lavender", "magenta", "cyan", "scarlet", "emerald", "ochre", "mint", "peach", "plum",
           "rust", "salmon", "tan", "charcoal", "lilac", "burgundy"]
JOBS = ["baker", "carpenter", "nurse", "pilot", "teacher", "plumber", "gardener", "librarian", "dentist", "farmer",
        "painter", "chemist", "sailor", "tailor", "butcher", "architect", "lawyer", "firefighter", "journalist",
        "photographer", "electrician", "mechanic", "pharmacist", "surgeon", "florist", "potter", "translator",
        "beekeeper", "cartographer", "astronomer", "blacksmith", "chef", "dancer", "engineer", "geologist",
        "jeweller", "locksmith", "musician", "optician", "zookeeper", "barber", "brewer", "clockmaker", "diver",
        "fisherman", "glassblower", "shepherd", "surveyor", "veterinarian", "weaver"]
OBJECTS = ["umbrella", "passport", "wallet", "guitar", "telescope", "laptop", "camera", "notebook", "violin",
           "toolbox", "backpack", "lantern", "kettle", "chessboard", "microscope", "sewing kit", "tennis racket",
           "suitcase", "bicycle pump", "map", "compass", "flute", "helmet", "raincoat", "blanket", "hammer",
           "teapot", "calculator", "paintbrush", "skateboard", "harmonica", "spyglass", "stapler", "candle",
           "scarf", "globe", "typewriter", "fishing rod", "watering can", "keyboard"]
ROOMS = ["kitchen", "garage", "attic", "basement", "bedroom", "hallway", "study", "pantry", "greenhouse", "cellar",
         "shed", "bathroom", "office", "library", "porch", "laundry room", "dining room", "living room", "workshop",
         "closet", "balcony", "loft", "nursery", "conservatory", "garden", "car", "locker room", "studio",
         "storeroom", "classroom"]
LANDMARK_KINDS = ["House", "Tower", "Bridge", "Museum", "Castle", "Park", "Cathedral", "Palace", "Library", "Gardens",
                  "Abbey", "Lighthouse", "Market", "Station", "Theatre", "Mill", "Observatory", "Fort"]
SPECIES = ["cat", "dog", "parrot", "rabbit", "hamster", "tortoise", "goldfish", "horse", "ferret", "goat"]


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(syllables)).capitalize()


def _unique(make, count: int, rng: random.Random, longest: int = 10) -> list[str]:
    seen, out = set(), []
    while len(out) < count:
        item = make(rng)
        if item not in seen and 3 <= len(item) <= longest:
            seen.add(item)
            out.append(item)
    return out


def _cut(items: list, split: str) -> list:
    """The train or held-out part of a pool (every HELDOUT_SHARE-th item is held out)."""
    return [item for i, item in enumerate(items) if (i % HELDOUT_SHARE == 0) == (split == "heldout")]


@dataclass(frozen=True)
class Pools:
    people: list[str]
    towns: list[str]
    pets: list[str]
    landmarks: list[str]
    lockers: list[int]
    codes: list[int]
    times: list[str]
    ages: list[int]
    colours: list[str]
    jobs: list[str]
    objects: list[str]
    rooms: list[str]


_POOLS: dict[str, Pools] = {}


def pools(split: str) -> Pools:
    """The entity and value pools of one split (fixed, whatever the data seed)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if split not in _POOLS:
        rng = random.Random(POOL_SEED)
        first = _unique(lambda r: _name(r, r.choice((1, 2, 2, 3))), 3000, rng)
        last = _unique(lambda r: _name(r, r.choice((2, 2, 3))), 3000, rng)
        people = [f"{a} {b}" for a, b in zip(first, last)]
        towns = _unique(lambda r: _name(r, r.choice((1, 2))) + r.choice(TOWN_ENDINGS), 2500, rng, longest=12)
        pets = _unique(lambda r: _name(r, r.choice((1, 2))), 2000, rng)
        landmarks = _unique(lambda r: _name(r, r.choice((1, 2))) + " " + r.choice(LANDMARK_KINDS), 2500, rng, longest=24)
        shuffled = lambda values: rng.sample(values, len(values))  # noqa: E731
        lockers = shuffled(list(range(1, 1000)))
        codes = shuffled(list(range(1000, 10000)))
        times = shuffled([f"{h}:{m:02d}" for h in range(5, 24) for m in range(0, 60, 5)])
        ages = shuffled(list(range(18, 96)))
        for part in SPLITS:
            _POOLS[part] = Pools(
                people=_cut(people, part), towns=_cut(towns, part), pets=_cut(pets, part), landmarks=_cut(landmarks, part), lockers=_cut(lockers, part),
                codes=_cut(codes, part), times=_cut(times, part), ages=_cut(ages, part),
                colours=_cut(COLOURS, part), jobs=_cut(JOBS, part), objects=_cut(OBJECTS, part), rooms=_cut(ROOMS, part),
            )
    return _POOLS[split]


def article(word: str) -> str:
    """The indefinite article the facts put before ``word`` ("an" before a vowel, else "a"), for
    text written like these records."""
    return "an" if word[0] in "aeiou" else "a"


# template name -> (entity pool, fact, question, answer); each fact is made from (entity, rng, pools)
def _fact(kind: str, entity, rng: random.Random, p: Pools) -> tuple[str, str, str]:
    if kind == "town":
        town = rng.choice(p.towns)
        return f"{entity} lives in {town}.", f"Where does {entity} live?", town
    if kind == "colour":
        colour = rng.choice(p.colours)
        return f"{entity}'s favourite colour is {colour}.", f"What is {entity}'s favourite colour?", colour
    if kind == "age":
        age = str(rng.choice(p.ages))
        return f"{entity} is {age} years old.", f"How old is {entity}?", age
    if kind == "job":
        job = rng.choice(p.jobs)
        return f"{entity} works as {article(job)} {job}.", f"What is {entity}'s job?", job
    if kind == "object":
        thing, room = rng.choice(p.objects), rng.choice(p.rooms)
        return f"{entity}'s {thing} is in the {room}.", f"Where is {entity}'s {thing}?", room
    if kind == "pet":
        species, pet = rng.choice(SPECIES), rng.choice(p.pets)
        return f"{entity} has {article(species)} {species} called {pet}.", f"What is the name of {entity}'s {species}?", pet
    if kind == "landmark":
        landmark = rng.choice(p.landmarks)
        return f"{entity} is at the {landmark}.", f"Where is {entity}?", landmark
    if kind == "locker":
        code = str(rng.choice(p.codes))
        return f"The code for locker {entity} is {code}.", f"What is the code for locker {entity}?", code
    if kind == "train":
        time = rng.choice(p.times)
        return f"The train to {entity} leaves at {time}.", f"When does the train to {entity} leave?", time
    raise ValueError(kind)


KINDS = ("town", "colour", "age", "job", "object", "pet", "landmark", "locker", "train")
_ENTITY_POOL = {"locker": "lockers", "train": "towns"}


def _entity(kind: str, rng: random.Random, p: Pools):
    return rng.choice(getattr(p, _ENTITY_POOL.get(kind, "people")))


# the pool each kind's answer comes from
_VALUE_POOL = {"town": "towns", "colour": "colours", "age": "ages", "job": "jobs", "object": "rooms", "pet": "pets",
               "landmark": "landmarks", "locker": "codes", "train": "times"}


def values_of(kind: str, split: str) -> list[str]:
    """Every value a fact of ``kind`` may answer with in ``split`` (as text): what a swapped fact
    draws from (``kvviz.data.swaps``)."""
    if kind not in _VALUE_POOL:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return [str(value) for value in getattr(pools(split), _VALUE_POOL[kind])]


def generate(split: str = "train", n: int = 1000, seed: int = 0, max_distractors: int = 2) -> list[Record]:
    """``n`` recall records of one split; the same (split, n, seed) gives the same records."""
    p = pools(split)
    rng = random.Random(f"recall-{split}-{seed}")
    records = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)] if i < len(KINDS) else rng.choice(KINDS)
        entity = _entity(kind, rng, p)
        fact, question, answer = _fact(kind, entity, rng, p)
        facts = [fact]
        used = {str(entity)}
        for _ in range(rng.randint(0, max_distractors)):
            other_kind = rng.choice(KINDS)
            other = _entity(other_kind, rng, p)
            if str(other) in used:
                continue
            used.add(str(other))
            other_fact, _, other_answer = _fact(other_kind, other, rng, p)
            if other_answer != answer:
                facts.append(other_fact)
        rng.shuffle(facts)
        records.append(
            Record(
                id=f"recall-{split}-{seed}-{i}",
                question=question,
                context=" ".join(facts),
                answers=[answer],
                choices=None,
                answer_index=None,
                source="recall",
                response=answer,
                meta={"kind": kind, "entity": str(entity), "facts": len(facts)},
            )
        )
    return records


def load_recall(*, split: str = "heldout", n: int = 200, data_seed: int = 0, data_dir=None, report=None) -> list[Record]:
    """The recall records as a registered dataset (``--dataset recall``): ``n`` records of ``split``
    (held out by default: names and values never used in training), made here, no file read."""
    return generate(split, int(n), int(data_seed))

