"""Text for `tokshard demo`, written by the project itself (no download, no third-party text).

A small grammar produces encyclopedia articles, news stories and novel-like sentences
about an invented world. It is regular enough that a tiny model's loss visibly falls in a
minute of CPU training, and varied enough that BPE learns real subwords. Deterministic
for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

PLACES = [
    "Aldermoor", "Brightwater", "Calloway", "Dunmere", "Eastholm", "Fairhaven", "Glenrock", "Harrowgate",
    "Ivybridge", "Juniper Falls", "Kingsmere", "Larkspur", "Millbrook", "Northwick", "Oakhurst", "Pemberton",
    "Queensport", "Ravenscar", "Stonebridge", "Thornbury", "Umberlee", "Valemont", "Westerly", "Yarrowdale",
]  # fmt: skip
PEOPLE = [
    "Ada Whitlock", "Bram Okafor", "Clara Voss", "Desmond Hale", "Elena Marsh", "Felix Arden", "Greta Lindqvist",
    "Hugo Brandt", "Iris Calder", "Jonas Petrov", "Kara Nakamura", "Leo Fairbanks", "Mira Castellanos",
    "Nils Eriksen", "Olive Thorne", "Pavel Novak", "Rosa Delgado", "Silas Greer", "Tessa Moreau", "Victor Achebe",
]  # fmt: skip
THINGS = [
    "bridge", "library", "observatory", "railway", "harbour", "cathedral", "canal", "museum", "university",
    "lighthouse", "market", "theatre", "garden", "mill", "fortress", "archive", "school", "hospital",
]  # fmt: skip
ADJECTIVES = [
    "old", "new", "small", "large", "famous", "quiet", "busy", "ancient", "modern", "northern", "southern",
    "historic", "remote", "coastal", "wooden", "stone", "public", "private", "royal", "municipal",
]  # fmt: skip
VERBS_PAST = [
    "built", "restored", "designed", "opened", "expanded", "closed", "rebuilt", "visited", "described",
    "painted", "studied", "funded", "managed", "renamed", "moved", "founded",
]  # fmt: skip
TOPICS = ["History", "Geography", "Architecture", "Economy", "Culture", "Transport", "Education", "Legacy"]
TRADES = ["fishing", "weaving", "shipbuilding", "farming", "printing", "brewing", "mining", "trade in wool"]
WEATHER = ["rain", "fog", "snow", "wind", "sunlight", "frost", "storm", "warm breeze"]
FEELINGS = ["calm", "uneasy", "hopeful", "tired", "curious", "certain", "afraid", "glad"]
ACTIONS = [
    "opened the door", "looked out of the window", "picked up the letter", "walked to the harbour",
    "lit the lamp", "closed the book", "poured the tea", "climbed the stairs", "counted the coins",
]  # fmt: skip


@dataclass
class World:
    rng: random.Random

    def pick(self, items: list[str]) -> str:
        return self.rng.choice(items)

    def year(self) -> int:
        return self.rng.randint(1650, 2020)

    def number(self) -> str:
        return f"{self.rng.randint(2, 900):,}"

    def sentence(self, place: str) -> str:
        r = self.rng.random()
        thing = f"{self.pick(ADJECTIVES)} {self.pick(THINGS)}"
        if r < 0.2:
            return (
                f"The {thing} in {place} was {self.pick(VERBS_PAST)} in {self.year()} by {self.pick(PEOPLE)}."
            )
        if r < 0.4:
            return f"In {self.year()}, {self.pick(PEOPLE)} {self.pick(VERBS_PAST)} the {thing} of {place}."
        if r < 0.55:
            return f"{place} is known for its {thing} and for {self.pick(TRADES)}."
        if r < 0.7:
            return f"About {self.number()} people lived in {place} in {self.year()}, most of them working in {self.pick(TRADES)}."
        if r < 0.85:
            return f"The {thing} lies {self.rng.randint(2, 40)} kilometres from {self.pick(PLACES)}, on the road to {place}."
        return (
            f"According to {self.pick(PEOPLE)}, the {thing} was the finest in the region until {self.year()}."
        )

    def paragraph(self, place: str, n: int) -> str:
        return " ".join(self.sentence(place) for _ in range(n))


def wiki_articles(seed: int, n: int) -> Iterator[list[str]]:
    """Articles as WikiText rows: lines with ' = Title = ' and ' = = Section = = ' headings."""
    w = World(random.Random(seed))
    for i in range(n):
        place = f"{w.pick(PLACES)} {w.pick(THINGS).title()}" if i % 3 else w.pick(PLACES)
        rows = [f" = {place} = \n", "\n", f" {w.paragraph(place, w.rng.randint(2, 4))} \n", "\n"]
        for topic in w.rng.sample(TOPICS, w.rng.randint(2, 4)):
            rows += [f" = = {topic} = = \n", "\n", f" {w.paragraph(place, w.rng.randint(3, 6))} \n", "\n"]
        yield rows


def news_articles(seed: int, n: int) -> Iterator[dict[str, str]]:
    """CC-News style records: title, text, domain, date, description, url, image_url."""
    w = World(random.Random(seed))
    for i in range(n):
        place = w.pick(PLACES)
        person = w.pick(PEOPLE)
        title = f"{person} {w.pick(VERBS_PAST)} the {w.pick(ADJECTIVES)} {w.pick(THINGS)} in {place}"
        text = "\n\n".join(w.paragraph(place, w.rng.randint(2, 5)) for _ in range(w.rng.randint(2, 5)))
        domain = f"{place.lower().replace(' ', '')}-{w.pick(['herald', 'gazette', 'times', 'post'])}.example"
        slug = title.lower().replace(" ", "-")
        yield {
            "title": title if i % 17 else "",
            "text": text,
            "domain": domain,
            "date": f"{w.rng.randint(2016, 2019)}-{w.rng.randint(1, 12):02d}-{w.rng.randint(1, 28):02d} 08:00:00",
            "description": text.split(".")[0] + ".",
            "url": f"https://{domain}/news/{slug}",
            "image_url": f"https://{domain}/img/{i}.jpg",
        }


def book_sentences(seed: int, n: int) -> Iterator[str]:
    """BookCorpus style: one sentence per row, lowercased, no book boundaries."""
    w = World(random.Random(seed))
    for _ in range(n):
        r = w.rng.random()
        name = w.pick(PEOPLE).split()[0]
        if r < 0.3:
            s = f"{name} {w.pick(ACTIONS)} and felt {w.pick(FEELINGS)} ."
        elif r < 0.5:
            s = f"outside , the {w.pick(WEATHER)} covered {w.pick(PLACES)} ."
        elif r < 0.7:
            s = f'" we should go to {w.pick(PLACES)} , " said {name} .'
        elif r < 0.85:
            s = f"{name} remembered the {w.pick(ADJECTIVES)} {w.pick(THINGS)} from the summer of {w.year()} ."
        else:
            s = f"nobody in {w.pick(PLACES)} knew why {name} had {w.pick(VERBS_PAST)} the {w.pick(THINGS)} ."
        yield s.lower()
