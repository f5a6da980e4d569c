"""The collections behind ``rag``: a generated knowledge base (deterministic from a seed) and a user's own
JSONL corpus and questions.

The generated knowledge base is a set of *clusters*, each a company and the people who work there (one of
them its founder). Every fact is one short passage (``Nalo works at Tavco.``), and every entity also has a
distractor passage that mentions it without answering any question (``Nalo visited Rome.``). Questions
are single-hop (one fact: ``Nalo lives in which city?``) or two-hop (a fact about an entity named in
another fact: ``Nalo's employer is based in which city?``). The oracle query of a hop is the subject and
the relation word, ``Nalo works``; BM25 ranks the fact passage first for it. Splits are by cluster, so
held-out questions are about entities (subjects, bridges, answers) that no train question involves.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import SPLITS, stable_hash
from .datafile import json_lines

CITIES = ("Lima", "Oslo", "Rome", "Cairo", "Delhi", "Paris", "Tokyo", "Quito", "Perth", "Dakar", "Hanoi", "Riga")
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
_RESERVED = {c.lower() for c in CITIES} | {"a", "an", "the", "in", "at", "by", "was", "is", "of", "who", "whom"}


@dataclass(frozen=True)
class Passage:
    """One retrievable passage: a stable id and its text (whitespace collapsed)."""

    id: str
    text: str


@dataclass(frozen=True)
class Relation:
    """A fact type: its passage template and the relation word an oracle query uses."""

    name: str
    template: str  # "{s} lives in {o}."
    subject: str  # "person" or "company"

    def passage(self, s: str, o: str) -> str:
        return self.template.format(s=s, o=o)

    def read(self, text: str, subject: str) -> str | None:
        """The object of this relation for ``subject`` in ``text`` (one passage per line), or None."""
        head, tail = self.template.split("{o}")
        pattern = re.escape(head.format(s=subject)) + r"([A-Za-z0-9]+)" + re.escape(tail)
        found = re.search(r"(?m)^" + pattern + r"$", text)
        return found.group(1) if found else None


RELATIONS = {r.name: r for r in (
    Relation("lives", "{s} lives in {o}.", "person"),
    Relation("works", "{s} works at {o}.", "person"),
    Relation("born", "{s} was born in {o}.", "person"),
    Relation("based", "{s} is based in {o}.", "company"),
    Relation("founded", "{s} was founded by {o}.", "company"),
    Relation("opened", "{s} opened in {o}.", "company"),
)}
DISTRACTORS = {"person": "{s} visited {o}.", "company": "{s} has an office in {o}."}


@dataclass(frozen=True)
class QuestionTemplate:
    """A question about an entity of one kind, answered by following ``chain`` relations from it."""

    name: str
    kind: str  # "person" or "company"
    text: str
    chain: tuple[str, ...]


QUESTION_TEMPLATES = (
    QuestionTemplate("p_city", "person", "{x} lives in which city?", ("lives",)),
    QuestionTemplate("p_employer", "person", "{x} works at which company?", ("works",)),
    QuestionTemplate("p_born", "person", "{x} was born in which year?", ("born",)),
    QuestionTemplate("c_city", "company", "{x} is based in which city?", ("based",)),
    QuestionTemplate("c_founder", "company", "{x} was founded by whom?", ("founded",)),
    QuestionTemplate("c_year", "company", "{x} opened in which year?", ("opened",)),
    QuestionTemplate("p_employer_city", "person", "{x}'s employer is based in which city?", ("works", "based")),
    QuestionTemplate("p_employer_year", "person", "{x}'s employer opened in which year?", ("works", "opened")),
    QuestionTemplate("c_founder_city", "company", "{x}'s founder lives in which city?", ("founded", "lives")),
    QuestionTemplate("c_founder_born", "company", "{x}'s founder was born in which year?", ("founded", "born")),
)


@dataclass
class KnowledgeBase:
    """A generated collection: passages, facts ``(subject, relation) -> object``, the passage id of each
    fact, the entities of each cluster (company first) and every entity's kind."""

    passages: list[Passage]
    facts: dict[tuple[str, str], str]
    support: dict[tuple[str, str], str]
    clusters: list[list[str]]
    kinds: dict[str, str]


MAX_PERSONS = 4800  # two-syllable person names: (14 consonants x 5 vowels)^2 = 4900, less the reserved words
MAX_COMPANIES = 60000  # two syllables and a final consonant: 68 600


def _names(rng: random.Random, count: int, syllables: int, coda: bool, taken: set[str]) -> list[str]:
    """``count`` new pronounceable names (CV syllables, optionally a final consonant), unique in ``taken``."""
    out: list[str] = []
    while len(out) < count:
        name = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
        name = (name + rng.choice(CONSONANTS) if coda else name).capitalize()
        if name.lower() not in taken and name.lower() not in _RESERVED:
            taken.add(name.lower())
            out.append(name)
    return out


def generate_kb(seed: int, n_companies: int, people: int, stream: str = "",
                exclude: Collection[str] = ()) -> KnowledgeBase:
    """The knowledge base of ``n_companies`` clusters of one company and ``people`` persons; deterministic.
    ``stream`` names another knowledge base of the same shape (its passage ids carry it as a prefix), whose names
    avoid ``exclude`` (lower case): rag's validation collection is ``stream="validation"``, clear of the main
    one's names."""
    if n_companies * people > MAX_PERSONS or n_companies > MAX_COMPANIES:
        raise ConfigError(f"rag knowledge base of {n_companies} companies x {people} people is too large: the generated "
                          f"names allow at most {MAX_PERSONS} persons and {MAX_COMPANIES} companies")
    persons_taken = sum(1 for name in exclude if len(name) == 4)  # a person's name is two CV syllables
    if n_companies * people + persons_taken > MAX_PERSONS:
        raise ConfigError(f"rag knowledge base of {n_companies} companies x {people} people is too large for a "
                          f"{stream} collection of its own: {persons_taken} of the {MAX_PERSONS} person names are taken")
    rng = random.Random(stable_hash(f"rag/kb/{seed}/{n_companies}/{people}" + (f"/{stream}" if stream else "")))
    taken: set[str] = set(exclude)
    companies = _names(rng, n_companies, 2, True, taken)
    persons = _names(rng, n_companies * people, 2, False, taken)
    facts: dict[tuple[str, str], str] = {}
    texts: list[tuple[tuple[str, str] | None, str]] = []  # (fact key or None for a distractor, text)
    clusters, kinds = [], {}

    def add(subject: str, relation: str, obj: str) -> None:
        facts[(subject, relation)] = obj
        texts.append(((subject, relation), RELATIONS[relation].passage(subject, obj)))

    for i, company in enumerate(companies):
        staff = persons[i * people:(i + 1) * people]
        city = rng.choice(CITIES)
        add(company, "based", city)
        add(company, "opened", str(rng.randint(1900, 2020)))
        add(company, "founded", rng.choice(staff))
        texts.append((None, DISTRACTORS["company"].format(s=company, o=rng.choice([c for c in CITIES if c != city]))))
        kinds[company] = "company"
        for person in staff:
            home = rng.choice(CITIES)
            add(person, "lives", home)
            add(person, "works", company)
            add(person, "born", str(rng.randint(1950, 2005)))
            texts.append((None, DISTRACTORS["person"].format(s=person, o=rng.choice([c for c in CITIES if c != home]))))
            kinds[person] = "person"
        clusters.append([company, *staff])
    rng.shuffle(texts)  # a passage's position says nothing about what it is
    passages, support = [], {}
    for j, (key, text) in enumerate(texts):
        passages.append(Passage(f"{stream}-kb{j}" if stream else f"kb{j}", text))
        if key is not None:
            support[key] = passages[-1].id
    return KnowledgeBase(passages, facts, support, clusters, kinds)


def kb_questions(kb: KnowledgeBase, heldout_fraction: float, seed: int) -> dict[str, list[dict[str, Any]]]:
    """The questions of each split, as records (see :func:`question_record`); clusters are split, so the
    held-out ones are ``round(heldout_fraction * clusters)`` clusters drawn with ``seed``."""
    rng = random.Random(stable_hash(f"rag/split/{seed}/{len(kb.clusters)}"))
    held = set(rng.sample(range(len(kb.clusters)), round(heldout_fraction * len(kb.clusters))))
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for i, cluster in enumerate(kb.clusters):
        for template in QUESTION_TEMPLATES:
            for x in (e for e in cluster if kb.kinds[e] == template.kind):
                subject, queries, support, entities = x, [], [], [x]
                for relation in template.chain:
                    queries.append(f"{subject} {relation}")
                    support.append(kb.support[(subject, relation)])
                    subject = kb.facts[(subject, relation)]
                    if subject in kb.kinds:
                        entities.append(subject)
                out["heldout" if i in held else "train"].append({
                    "id": f"{template.name}:{x}", "question": template.text.format(x=x), "answers": [subject],
                    "hops": len(template.chain), "entity": x, "relations": list(template.chain),
                    "queries": queries, "support": support, "entities": entities, "cluster": i,
                    "template": template.name})
    return out


# ------------------------------------------------------------------------------------------------
# A user's own collection: JSONL files, one object per line.
# ------------------------------------------------------------------------------------------------
def _read_jsonl(path: str | Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line (:func:`~reflectrl.tasks.datafile.json_lines`); one ConfigError
    naming the file and line otherwise."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"rag {what} file {p} {'is not a file' if p.exists() else 'does not exist'}")
    out = list(json_lines(p, f"rag {what} file"))
    if not out:
        raise ConfigError(f"rag {what} file {p} is empty")
    return out


def _field(obj: dict[str, Any], key: str, kinds: tuple[type, ...], where: str, required: bool = True) -> Any:
    if key not in obj:
        if required:
            raise ConfigError(f"{where}: missing field {key!r}")
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ConfigError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def load_corpus(path: str | Path) -> list[Passage]:
    """Passages from a JSONL file of ``{"id": str|int, "text": str}`` (an optional ``"title"`` is put in
    front of the text); one ConfigError naming the file and line for a malformed or duplicate entry."""
    passages, seen = [], set()
    for n, obj in _read_jsonl(path, "corpus"):
        where = f"rag corpus file {Path(path).expanduser()}, line {n}"
        pid = str(_field(obj, "id", (str, int), where))
        text = " ".join(_field(obj, "text", (str,), where).split())
        title = _field(obj, "title", (str,), where, required=False)
        if not text:
            raise ConfigError(f"{where}: field 'text' is empty")
        if pid in seen:
            raise ConfigError(f"{where}: duplicate passage id {pid!r}")
        seen.add(pid)
        passages.append(Passage(pid, f"{' '.join(title.split())}: {text}" if title and title.strip() else text))
    return passages


def load_questions(path: str | Path) -> list[dict[str, Any]]:
    """Question records from a JSONL file of ``{"id", "question", "answers": [str, ...]}`` with optional
    ``"hops"`` (a positive integer, default 1) and ``"split"`` (train, validation or heldout); one ConfigError naming
    the file and line for a malformed or duplicate entry."""
    out, seen = [], set()
    for n, obj in _read_jsonl(path, "questions"):
        where = f"rag questions file {Path(path).expanduser()}, line {n}"
        qid = str(_field(obj, "id", (str, int), where))
        question = " ".join(_field(obj, "question", (str,), where).split())
        answers = _field(obj, "answers", (list,), where)
        hops = _field(obj, "hops", (int,), where, required=False)
        split = _field(obj, "split", (str,), where, required=False)
        if not question:
            raise ConfigError(f"{where}: field 'question' is empty")
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ConfigError(f"{where}: field 'answers' must be a non-empty list of non-empty strings")
        if hops is not None and hops < 1:
            raise ConfigError(f"{where}: field 'hops' must be at least 1, got {hops}")
        if split is not None and split not in SPLITS:
            raise ConfigError(f"{where}: field 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
        if qid in seen:
            raise ConfigError(f"{where}: duplicate question id {qid!r}")
        seen.add(qid)
        out.append({"id": qid, "question": question, "answers": [a.strip() for a in answers], "hops": hops or 1,
                    "split": split, "queries": [question], "line": n})
    return out
