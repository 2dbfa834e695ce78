"""Who is where: notes that place one to three people at well-known landmarks or in well-known
cities, and a question whose answer is the *country*, which the note does not say.

"Kofi is standing under Big Ben." / "Which country is Kofi in?" -> United Kingdom. To answer, a
reader must recognise the landmark and know where it is: the receiver's own world knowledge, used
on a fact only the sharer read. A channel that copies surface tokens well but does not carry what
the landmark *is* gives the landmark's name, or one country for every landmark; one that carries
it gives the country, and follows a swapped landmark (``kvviz.data.swaps``: another held-out
landmark in another country).

Held out by entity: the landmarks and cities are split once, by a fixed rule, into a training part
and a held-out part (every third entry of each list, the page's presets' landmarks and any landmark
that Countries' evaluation records name are held out; a city named inside a landmark's name goes
with that landmark); people's names come from ``kvviz.data.recall``'s pools of the same split, so held-out
records name landmarks, cities and people that no training record names. With two or three people
per note the question asks about one of them (``meta["people"]`` > 1): a *binding* test, where the
other people's places are in the note too and the right country is only the asked person's.

Every list below is written here (no external data); the countries are the landmarks' own.
"""

from __future__ import annotations

import functools
import random
import re

from kvviz.data import recall
from kvviz.data.record import Record

SPLITS = recall.SPLITS

# (landmark as the note names it, country): well-known landmarks, a few per country
LANDMARKS = [
    ("the Eiffel Tower", "France"), ("the Louvre", "France"), ("Mont Saint-Michel", "France"),
    ("the Palace of Versailles", "France"), ("Notre-Dame de Paris", "France"), ("the Arc de Triomphe", "France"),
    ("Big Ben", "United Kingdom"), ("Stonehenge", "United Kingdom"), ("Buckingham Palace", "United Kingdom"),
    ("the Tower of London", "United Kingdom"), ("Edinburgh Castle", "United Kingdom"), ("Tower Bridge", "United Kingdom"),
    ("the Colosseum", "Italy"), ("the Leaning Tower of Pisa", "Italy"), ("the Trevi Fountain", "Italy"),
    ("the Rialto Bridge", "Italy"), ("Pompeii", "Italy"),
    ("the Sagrada Familia", "Spain"), ("the Alhambra", "Spain"), ("Park Guell", "Spain"), ("the Prado Museum", "Spain"),
    ("the Brandenburg Gate", "Germany"), ("Neuschwanstein Castle", "Germany"), ("Cologne Cathedral", "Germany"),
    ("the Reichstag", "Germany"),
    ("the Acropolis", "Greece"), ("the Parthenon", "Greece"), ("Meteora", "Greece"),
    ("the Statue of Liberty", "United States"), ("the Golden Gate Bridge", "United States"),
    ("the Grand Canyon", "United States"), ("Mount Rushmore", "United States"), ("the Empire State Building", "United States"),
    ("the White House", "United States"), ("Times Square", "United States"), ("the Hollywood Sign", "United States"),
    ("Niagara Falls", "Canada"), ("the CN Tower", "Canada"), ("Banff National Park", "Canada"),
    ("Chichen Itza", "Mexico"), ("Teotihuacan", "Mexico"),
    ("Machu Picchu", "Peru"), ("Lake Titicaca", "Peru"),
    ("Christ the Redeemer", "Brazil"), ("Sugarloaf Mountain", "Brazil"), ("Copacabana Beach", "Brazil"),
    ("Iguazu Falls", "Argentina"), ("the Perito Moreno Glacier", "Argentina"),
    ("Easter Island", "Chile"),
    ("the Great Wall", "China"), ("the Forbidden City", "China"), ("the Terracotta Army", "China"),
    ("Tiananmen Square", "China"), ("the Potala Palace", "China"),
    ("Mount Fuji", "Japan"), ("the Tokyo Tower", "Japan"), ("the Fushimi Inari Shrine", "Japan"),
    ("the Hiroshima Peace Memorial", "Japan"), ("Kinkaku-ji", "Japan"),
    ("the Taj Mahal", "India"), ("the Red Fort", "India"), ("the Gateway of India", "India"), ("the Golden Temple", "India"),
    ("the Great Pyramid of Giza", "Egypt"), ("the Sphinx", "Egypt"), ("Abu Simbel", "Egypt"), ("the Valley of the Kings", "Egypt"),
    ("the Sydney Opera House", "Australia"), ("Uluru", "Australia"), ("the Great Barrier Reef", "Australia"),
    ("the Sydney Harbour Bridge", "Australia"),
    ("Red Square", "Russia"), ("the Kremlin", "Russia"), ("Saint Basil's Cathedral", "Russia"), ("the Hermitage Museum", "Russia"),
    ("Angkor Wat", "Cambodia"),
    ("Petra", "Jordan"),
    ("the Burj Khalifa", "United Arab Emirates"), ("the Sheikh Zayed Grand Mosque", "United Arab Emirates"),
    ("the Hagia Sophia", "Turkey"), ("the Blue Mosque", "Turkey"), ("Cappadocia", "Turkey"),
    ("the Rijksmuseum", "Netherlands"), ("the Anne Frank House", "Netherlands"),
    ("the Atomium", "Belgium"), ("the Manneken Pis", "Belgium"),
    ("the Matterhorn", "Switzerland"), ("the Jungfraujoch", "Switzerland"),
    ("Schonbrunn Palace", "Austria"),
    ("Prague Castle", "Czech Republic"), ("the Charles Bridge", "Czech Republic"),
    ("Tivoli Gardens", "Denmark"),
    ("the Blue Lagoon", "Iceland"),
    ("the Cliffs of Moher", "Ireland"), ("the Guinness Storehouse", "Ireland"),
    ("the Belem Tower", "Portugal"),
    ("Table Mountain", "South Africa"), ("Robben Island", "South Africa"),
    ("Mount Kilimanjaro", "Tanzania"), ("the Serengeti", "Tanzania"),
    ("Victoria Falls", "Zambia"),
    ("the Marina Bay Sands", "Singapore"),
    ("the Petronas Towers", "Malaysia"),
    ("Ha Long Bay", "Vietnam"),
    ("Gyeongbokgung Palace", "South Korea"),
    ("Mount Everest base camp", "Nepal"),
    ("the Western Wall", "Israel"),
    ("Hobbiton", "New Zealand"), ("Milford Sound", "New Zealand"),
    ("the Wawel Castle", "Poland"),
    ("the Vasa Museum", "Sweden"),
    ("the Geirangerfjord", "Norway"),
]

# (city, country): well-known cities whose country a reader must know
CITIES = [
    ("Paris", "France"), ("Lyon", "France"), ("Marseille", "France"), ("Nice", "France"),
    ("London", "United Kingdom"), ("Manchester", "United Kingdom"), ("Liverpool", "United Kingdom"), ("Oxford", "United Kingdom"),
    ("Rome", "Italy"), ("Venice", "Italy"), ("Florence", "Italy"), ("Milan", "Italy"), ("Naples", "Italy"),
    ("Madrid", "Spain"), ("Barcelona", "Spain"), ("Seville", "Spain"), ("Valencia", "Spain"),
    ("Berlin", "Germany"), ("Munich", "Germany"), ("Hamburg", "Germany"), ("Frankfurt", "Germany"),
    ("Athens", "Greece"), ("Thessaloniki", "Greece"),
    ("New York", "United States"), ("Chicago", "United States"), ("Los Angeles", "United States"), ("Boston", "United States"),
    ("San Francisco", "United States"), ("Miami", "United States"),
    ("Toronto", "Canada"), ("Vancouver", "Canada"), ("Montreal", "Canada"),
    ("Mexico City", "Mexico"), ("Cancun", "Mexico"),
    ("Lima", "Peru"), ("Cusco", "Peru"),
    ("Rio de Janeiro", "Brazil"), ("Sao Paulo", "Brazil"),
    ("Buenos Aires", "Argentina"),
    ("Santiago", "Chile"),
    ("Beijing", "China"), ("Shanghai", "China"), ("Hong Kong", "China"),
    ("Tokyo", "Japan"), ("Kyoto", "Japan"), ("Osaka", "Japan"),
    ("Mumbai", "India"), ("Delhi", "India"), ("Bangalore", "India"),
    ("Cairo", "Egypt"), ("Alexandria", "Egypt"),
    ("Sydney", "Australia"), ("Melbourne", "Australia"),
    ("Moscow", "Russia"), ("Saint Petersburg", "Russia"),
    ("Istanbul", "Turkey"), ("Ankara", "Turkey"),
    ("Amsterdam", "Netherlands"), ("Rotterdam", "Netherlands"),
    ("Brussels", "Belgium"), ("Zurich", "Switzerland"), ("Geneva", "Switzerland"),
    ("Vienna", "Austria"), ("Prague", "Czech Republic"), ("Copenhagen", "Denmark"),
    ("Stockholm", "Sweden"), ("Oslo", "Norway"), ("Helsinki", "Finland"), ("Reykjavik", "Iceland"),
    ("Dublin", "Ireland"), ("Lisbon", "Portugal"), ("Porto", "Portugal"),
    ("Warsaw", "Poland"), ("Krakow", "Poland"), ("Budapest", "Hungary"),
    ("Cape Town", "South Africa"), ("Johannesburg", "South Africa"),
    ("Nairobi", "Kenya"), ("Lagos", "Nigeria"), ("Marrakesh", "Morocco"),
    ("Bangkok", "Thailand"), ("Hanoi", "Vietnam"), ("Seoul", "South Korea"), ("Singapore", "Singapore"),
    ("Dubai", "United Arab Emirates"), ("Jerusalem", "Israel"), ("Tehran", "Iran"),
    ("Auckland", "New Zealand"), ("Havana", "Cuba"), ("Bogota", "Colombia"),
]

# the page's presets' landmarks (assets/presets.toml) are always held out: the page shows them
PRESET_LANDMARKS = ("Big Ben", "the Colosseum", "Mount Fuji", "Machu Picchu", "the Taj Mahal")
# and so are landmarks that KVComm's Countries names in the evaluators' 100 records
COUNTRIES_HELDOUT_LANDMARKS = ("the Brandenburg Gate",)

# what a right answer may say for a country
ALIASES = {
    "United States": ("United States", "USA", "United States of America"),  # not "US" ("with us") nor "America" ("South America")
    "United Kingdom": ("United Kingdom", "UK", "U.K.", "England", "Britain", "Great Britain", "Scotland"),
    "United Arab Emirates": ("United Arab Emirates", "UAE", "Dubai", "Abu Dhabi"),
    "Czech Republic": ("Czech Republic", "Czechia"),
    "South Korea": ("South Korea", "Korea"),
    "Netherlands": ("Netherlands", "Holland"),
}

PLACE_TEMPLATES = (
    "{name} is at {place}.", "{name} is standing in front of {place}.", "{name} is taking a photo of {place}.",
    "{name} is visiting {place} today.", "{name} is having lunch near {place}.", "{name} just arrived at {place}.",
)
CITY_TEMPLATES = ("{name} lives in {place}.", "{name} is on holiday in {place}.", "{name} is working in {place} this week.")
QUESTIONS = ("Which country is {name} in?", "In which country is {name} right now?", "Which country is {name} located in?")
CITY_QUESTIONS = ("Which country is {name} in?",)
MIXED_FILLERS = ("The weather is sunny.", "The trip took three hours.", "Nobody brought an umbrella.")


def answers_for(country: str) -> list[str]:
    """Every way a right answer may name ``country`` (the country first)."""
    return list(ALIASES.get(country, (country,)))


def _split_of(index: int, name: str) -> str:
    return "heldout" if name in PRESET_LANDMARKS + COUNTRIES_HELDOUT_LANDMARKS or index % 3 == 1 else "train"


def _city_split(index: int, city: str) -> str:
    """A city named inside a landmark's name ("the Tower of London") goes with that landmark's split,
    so that no text of one split names a place of the other."""
    for i, (landmark, _) in enumerate(LANDMARKS):
        if re.search(rf"(?<!\w){re.escape(city)}(?!\w)", landmark):
            return _split_of(i, landmark)
    return _split_of(index, city)


def places(kind: str, split: str) -> list[tuple[str, str]]:
    """The (place, country) pairs of one split: ``kind`` "landmark" or "city"."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    return list(_places(kind, split))


@functools.cache
def _places(kind: str, split: str) -> tuple[tuple[str, str], ...]:
    """``places``, computed once (a city's split reads every landmark's name: the swaps and the notes
    ask thousands of times)."""
    if kind == "city":
        return tuple((name, country) for i, (name, country) in enumerate(CITIES) if _city_split(i, name) == split)
    return tuple((name, country) for i, (name, country) in enumerate(LANDMARKS) if _split_of(i, name) == split)


def place_words(split: str) -> list[str]:
    """The names of one split's landmarks and cities as they appear in text ("Eiffel Tower", "Kyoto"),
    for a corpus that must leave the other split's out."""
    names = [name for name, _ in places("landmark", split) + places("city", split)]
    return sorted({name[4:] if name.startswith("the ") else name for name in names})


def recall_words(split: str) -> set[str]:
    """Every word of one split's ``kvviz.data.recall`` names: people, towns, pets, landmarks."""
    p = recall.pools(split)
    words = {w for person in p.people for w in person.split()} | set(p.towns) | set(p.pets)
    return words | {w for landmark in p.landmarks for w in landmark.split()}


def first_names(split: str) -> list[str]:
    """People's first names of one split (``kvviz.data.recall``'s pools: split by entity), less any
    that is a word of the other split's recall names (a train name is never a held-out surname)."""
    other = recall_words("train" if split == "heldout" else "heldout")
    seen, out = set(), []
    for person in recall.pools(split).people:
        first = person.split()[0]
        if first not in seen and first not in other:
            seen.add(first)
            out.append(first)
    return out


def _note(rng: random.Random, split: str, people: int, cities: float) -> tuple[str, list[tuple[str, str, str]]]:
    """A note placing ``people`` people at places in different countries: (text, [(name, place, country)])."""
    names = rng.sample(first_names(split), people)
    chosen, countries = [], set()
    for name in names:
        kind = "city" if rng.random() < cities else "landmark"
        options = [p for p in places(kind, split) if p[1] not in countries]
        place, country = rng.choice(options)
        countries.add(country)
        chosen.append((name, place, country, kind))
    sentences = []
    for name, place, _, kind in chosen:
        template = rng.choice(CITY_TEMPLATES if kind == "city" else PLACE_TEMPLATES)
        sentence = template.format(name=name, place=place)
        sentences.append(sentence[0].upper() + sentence[1:])
    if rng.random() < 0.2:
        sentences.insert(rng.randrange(len(sentences) + 1), rng.choice(MIXED_FILLERS))
    return " ".join(sentences), [(n, p, c) for n, p, c, _ in chosen]


def generate(split: str = "heldout", n: int = 100, seed: int = 0, people: tuple[int, ...] = (1, 2, 3),
             cities: float = 0.0) -> list[Record]:
    """``n`` who-is-where records of one split; the same arguments give the same records. Notes hold
    ``people[i % len(people)]`` people (so the counts are balanced); ``cities``: the share of places
    that are cities rather than landmarks (0: landmarks only, the evaluation's default)."""
    rng = random.Random(f"whereabouts-{split}-{seed}")
    records = []
    for i in range(n):
        count = people[i % len(people)]
        text, placed = _note(rng, split, count, cities)
        asked = rng.randrange(count)
        name, place, country = placed[asked]
        question = rng.choice(QUESTIONS).format(name=name)
        records.append(Record(
            id=f"whereabouts-{split}-{seed}-{i}", question=question, context=text, answers=answers_for(country),
            choices=None, answer_index=None, source="whereabouts", response=country,
            meta={"person": name, "landmark": place, "country": country, "people": count,
                  "others": [{"person": n, "landmark": p, "country": c} for j, (n, p, c) in enumerate(placed) if j != asked]},
        ))
    return records


def load_whereabouts(*, split: str = "heldout", n: int = 120, data_seed: int = 0, data_dir=None, report=None) -> list[Record]:
    """The who-is-where records as a registered dataset (``--dataset whereabouts``): ``n`` records of
    ``split`` (held out by default: landmarks and people never in training), made here, no file read."""
    return generate(split, int(n), int(data_seed))
