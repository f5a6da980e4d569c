"""``rag``: agentic retrieval. Search a BM25-indexed document collection over several turns, then answer.

Each turn the agent writes either ``<search>QUERY</search>`` (the environment returns the top-``k``
passages as feedback text, which the trainer masks out of the loss; ``no results`` when nothing matches)
or ``<answer>ANSWER</answer>`` (the episode ends). The outcome is the SQuAD-style exact match of the
normalized answer against any reference answer (token F1 with ``metric="f1"``, the character similarity
:func:`char_similarity` with ``metric="chars"``: partial credit for a near-copy); it is the final reward and
appears in ``info`` but never in the text the agent sees (``search_credit`` adds a step reward to a search that
first finds one of the question's facts). A turn's ``<confidence>`` / ``<reflect>`` tags
are parsed into that turn's ``info``.

The collection is a generated knowledge base (:mod:`reflectrl.tasks.rag_kb`, single- and two-hop
questions, split by entity) or a user's JSONL corpus and questions (``corpus=``, ``questions=``).
Retrieval is ``bm25s``; an index is built once per collection and shared by every environment (reads
are thread-safe). See docs/tasks.md.
"""

from __future__ import annotations

import random
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .base import (
    Problem,
    check_fraction,
    check_split,
    in_heldout,
    nonempty_split,
    parse_tagged_turn,
    register_task,
    self_report,
    stable_hash,
)
from .rag_kb import (
    CONSONANTS,
    RELATIONS,
    VOWELS,
    Passage,
    generate_kb,
    kb_questions,
    load_corpus,
    load_questions,
)

# bm25s's default token pattern (words of two or more characters), lower-cased, its English stopwords removed
TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")
QUERY_CHARS = 300  # a query is cut to this many characters before it is tokenized
ANSWER_CHARS = 1000  # an answer is cut to this many characters before it is normalized
INSTRUCTIONS = "Search with <search>QUERY</search>; answer with <answer>ANSWER</answer>."
REPORT_INSTRUCTIONS = {"off": "", "confidence": " Then add <confidence>P</confidence>, P from 0 to 1.",
                       "reflect": " Then add <reflect>solved</reflect> or <reflect>unsolved</reflect>.",
                       "steps": " Begin each turn with <confidence>P</confidence>, P from 0 to 1."}
CHAT_INSTRUCTIONS = ("Answer the question by searching a knowledge base. To search, write <search>QUERY</search> and "
                     "the results come back to you. When you know the answer, write <answer>ANSWER</answer> with "
                     "only the answer.")
CHAT_REPORT_INSTRUCTIONS = {"off": "", "confidence": " After the answer, write <confidence>P</confidence>, where P is "
                            "the probability from 0 to 1 that your answer is right.",
                            "reflect": " After the answer, write <reflect>solved</reflect> or "
                            "<reflect>unsolved</reflect>.",
                            "steps": " Begin each turn with <confidence>P</confidence>, where P is the probability "
                            "from 0 to 1 that you will answer right."}
STOP_SEQUENCES = {"off": ("</search>", "</answer>"), "confidence": ("</search>", "</confidence>"),
                  "reflect": ("</search>", "</reflect>"), "steps": ("</search>", "</answer>")}
NO_RESULTS = "\nno results\n"
INVALID = "\nerror: write <search>QUERY</search> to search or <answer>ANSWER</answer> to answer\n"
_TAG = re.compile(r"<(search|answer)>", re.IGNORECASE)
METRICS = ("em", "f1", "chars")  # the outcome: exact match, token F1, character similarity
DETOURS = ("relation", "typo")  # the wrong searches of a stepwise demonstration (a typo keeps a letter's kind)


# ------------------------------------------------------------------------------------------------
# Answers.
# ------------------------------------------------------------------------------------------------
_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, punctuation removed, articles (a, an, the) removed, whitespace
    collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals any normalized answer, else 0.0."""
    pred = normalize_answer(prediction)
    return 1.0 if any(pred == normalize_answer(a) for a in answers) else 0.0


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """The best SQuAD token F1 of the prediction against the answers (both empty counts 1, one empty 0)."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        same = sum((Counter(pred) & Counter(gold)).values())
        if same:
            p, r = same / len(pred), same / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


def char_similarity(prediction: str, answers: Sequence[str]) -> float:
    """The best character-level similarity of the normalized prediction to a normalized answer: difflib's
    ``SequenceMatcher.ratio``, 2 * (characters in matching blocks) / (total length); 1.0 only for an exact
    match (both empty counts 1). Partial credit for an answer copied with a wrong letter or digit."""
    from difflib import SequenceMatcher

    pred = normalize_answer(prediction)
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer)
        best = max(best, 1.0 if pred == gold else SequenceMatcher(None, pred, gold, autojunk=False).ratio())
    return best


def parse_turn(text: Any) -> tuple[str | None, str]:
    """(kind, content) of an agent turn: kind 'search' or 'answer' from the first opening tag (self-report
    tags removed first), or None. The content runs to the closing tag, or to the end of the text when it
    is missing (a generator that stops on it drops it)."""
    return parse_tagged_turn(text, _TAG)


# ------------------------------------------------------------------------------------------------
# Retrieval.
# ------------------------------------------------------------------------------------------------
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


class Index:
    """A BM25 index (``bm25s``, Lucene scoring) over passages; ``search`` is read-only and thread-safe."""

    def __init__(self, passages: Sequence[Passage], name: str = "the rag collection"):
        try:
            import bm25s
        except ModuleNotFoundError:
            raise ConfigError("the rag task needs bm25s: pip install 'bm25s>=0.2' (or reflectrl[llm])") from None
        self.passages = list(passages)
        self.stopwords = _stopwords()
        terms = [self.terms(p.text) for p in self.passages]
        if not any(terms):
            raise ConfigError(f"{name} has no searchable words (words of two or more characters, not stopwords)")
        self.bm25 = bm25s.BM25()
        self.bm25.index(terms, show_progress=False)

    def terms(self, text: str) -> list[str]:
        """Lower-cased words of two or more characters without English stopwords (bm25s's defaults)."""
        return [t for t in TOKEN_PATTERN.findall(text.lower()) if t not in self.stopwords]

    def search(self, query: str, k: int) -> list[Passage]:
        """The ``k`` best passages sharing a term with ``query``, best first (ties in collection order);
        an empty list when no term of the query is in the collection."""
        ids = self.bm25.get_tokens_ids(self.terms(query[:QUERY_CHARS]))
        if not ids:
            return []
        scores = self.bm25.get_scores(ids)
        hits = np.flatnonzero(scores > 0)
        if hits.size > k:
            cut = np.partition(scores[hits], hits.size - k)[hits.size - k]  # k-th best score
            hits = hits[scores[hits] >= cut]
        best = hits[np.lexsort((hits, -scores[hits]))][:k]
        return [self.passages[i] for i in best]


_INDEXES: dict[tuple, Index] = {}
_INDEX_LOCK = threading.Lock()
_INDEX_CACHE = 8


def shared_index(key: tuple, passages: Sequence[Passage], name: str = "the rag collection") -> Index:
    """The index of the collection ``key`` (built from ``passages`` the first time), shared process-wide."""
    with _INDEX_LOCK:
        index = _INDEXES.get(key)
        if index is None:
            index = Index(passages, name)
            while len(_INDEXES) >= _INDEX_CACHE:
                _INDEXES.pop(next(iter(_INDEXES)))
            _INDEXES[key] = index
        return index


def _hops(problem: Problem) -> list[tuple[str, str]]:
    """(subject, relation) of each hop of a generated question: its oracle queries are ``SUBJECT RELATION``."""
    return [(query[:-len(name) - 1], name) for query, name in zip(problem.meta["queries"], problem.meta["relations"])]


def render(passages: Sequence[Passage], chars: int) -> str:
    """Feedback text of a search: one passage per line (cut to ``chars`` characters), or ``no results``."""
    if not passages:
        return NO_RESULTS
    lines = [p.text if len(p.text) <= chars else p.text[:chars - 3].rstrip() + "..." for p in passages]
    return "\n" + "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# The task.
# ------------------------------------------------------------------------------------------------
def _int_option(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"rag {name} must be an integer {bound}, got {value!r}")
    return value


@register_task("rag")
class RAGTask:
    """Agentic retrieval QA: search a BM25 index over several turns, then answer (exact match or F1)."""

    name = "rag"
    multi_turn = True
    tool_kinds = ("search",)  # the env infos' "kind" of a turn that used a tool (searched the collection)
    detours = DETOURS
    max_new_tokens = 64  # one turn: a search or an answer with its confidence tag (~50 characters)
    chat_max_new_tokens = 64  # a chat model's turn (BPE tokens)

    def __init__(self, k: int = 2, max_turns: int = 4, metric: str = "em", report: str = "confidence",
                 instructions: bool = True, n_companies: int = 48, people: int = 3, heldout_fraction: float = 0.2,
                 seed: int = 0, corpus: str | None = None, questions: str | None = None, passage_chars: int = 300,
                 search_credit: float = 0.0, validation_fraction: float = 0.0):
        self.k = _int_option("k", k, 1, 50)
        self.max_turns = _int_option("max_turns", max_turns, 1)
        self.n_companies = _int_option("n_companies", n_companies, 1)
        self.people = _int_option("people", people, 1)
        self.passage_chars = _int_option("passage_chars", passage_chars, 20)
        self.seed = _int_option("seed", seed, -(2 ** 63))
        if metric not in METRICS:
            raise ConfigError(f"rag metric must be one of {', '.join(METRICS)}, got {metric!r}")
        if report not in STOP_SEQUENCES:
            raise ConfigError(f"rag report must be one of {', '.join(STOP_SEQUENCES)}, got {report!r}")
        if isinstance(heldout_fraction, bool) or not isinstance(heldout_fraction, (int, float)) \
                or not 0 <= heldout_fraction <= 1:
            raise ConfigError(f"rag heldout_fraction must be a number in [0, 1], got {heldout_fraction!r}")
        if isinstance(search_credit, bool) or not isinstance(search_credit, (int, float)) or not 0 <= search_credit <= 1:
            raise ConfigError(f"rag search_credit must be a number in [0, 1], got {search_credit!r}")
        self.search_credit = float(search_credit)
        self.validation_fraction = check_fraction("rag", "validation_fraction", validation_fraction)
        if self.validation_fraction and corpus is None:
            raise ConfigError("rag validation_fraction applies to a questions file; the generated knowledge base has a "
                              "validation collection of its own")
        if not isinstance(instructions, bool):
            raise ConfigError(f"rag instructions must be true or false, got {instructions!r}")
        if (corpus is None) != (questions is None):
            raise ConfigError("rag needs both corpus=PATH.jsonl and questions=PATH.jsonl (or neither: the "
                              "generated knowledge base)")
        self.metric, self.report, self.instructions = metric, report, bool(instructions)
        self.heldout_fraction = float(heldout_fraction)
        self.stop_sequences = STOP_SEQUENCES[report]
        self.corpus, self.questions = corpus, questions
        self._splits: dict[str, list[Problem]] | None = None
        self._passages: list[Passage] = []
        self._key: tuple = ()
        self._collections: dict[str, tuple[tuple, list[Passage]]] = {}
        self._names: set[str] = set()
        self._index: dict[str, Index] = {}
        self._lock = threading.Lock()
        self._load()

    # ------------------------------------------------------------------ collection and problems
    def _load(self) -> None:
        if self.corpus is None:
            kb = generate_kb(self.seed, self.n_companies, self.people)
            self._passages = kb.passages
            self._key = ("kb", self.seed, self.n_companies, self.people)
            records = kb_questions(kb, self.heldout_fraction, self.seed)
            self._names = {name.lower() for name in kb.kinds}  # the validation collection's names avoid these
        else:
            self._passages = load_corpus(self.corpus)
            stat = Path(self.corpus).expanduser().resolve().stat()
            self._key = ("file", str(Path(self.corpus).expanduser().resolve()), stat.st_mtime_ns, stat.st_size)
            records = {"train": [], "validation": [], "heldout": []}
            for rec in load_questions(self.questions):
                held = rec["split"] == "heldout" if rec["split"] else in_heldout(rec["id"], self.heldout_fraction,
                                                                                 f"rag/{self.seed}")
                kept = rec["split"] == "validation" or (
                    not held and not rec["split"] and in_heldout(rec["id"], self.validation_fraction,
                                                                 f"rag/{self.seed}/validation"))
                records["validation" if kept else "heldout" if held else "train"].append(rec)
        self._collections["main"] = (self._key, self._passages)
        self._splits = {split: [self._problem(r) for r in recs] for split, recs in records.items()}

    def _generate_validation(self) -> None:
        """The generated knowledge base's validation split, built on first use: the questions of as many new clusters
        as heldout has (entities named apart from every train and heldout one), each searching the main collection
        with the new clusters' passages added, as a heldout question searches the main collection with its own
        clusters' passages in it. Train and heldout questions, passages and searches are as without it."""
        with self._lock:
            if "validation" in self._collections:
                return
            n = round(self.heldout_fraction * self.n_companies)
            other = generate_kb(self.seed, n, self.people, "validation", self._names) if n else None
            records = kb_questions(other, 1.0, self.seed)["heldout"] if other else []
            assert self._splits is not None
            self._splits["validation"] = [self._problem({**r, "collection": "validation"}) for r in records]
            passages = self._passages + (other.passages if other else [])
            random.Random(stable_hash(f"rag/validation/{self.seed}")).shuffle(passages)  # position says nothing
            self._collections["validation"] = ((*self._key, "validation"), passages)

    def _problem(self, rec: dict[str, Any]) -> Problem:
        meta = {k: v for k, v in rec.items() if k not in ("id", "split", "line")}
        return Problem(id=f"rag:{rec['id']}", prompt=self._prompt(rec["question"]), answer=rec["answers"][0],
                       meta=meta)

    def _prompt(self, question: str) -> str:
        head = INSTRUCTIONS + REPORT_INSTRUCTIONS[self.report] + "\n" if self.instructions else ""
        return f"{head}question: {question}\n"

    def chat_prompt(self, problem: Problem) -> str:
        """The first message to a chat model: the turn protocol and the question."""
        head = CHAT_INSTRUCTIONS + CHAT_REPORT_INSTRUCTIONS[self.report] + "\n\n" if self.instructions else ""
        return f"{head}Question: {problem.meta['question']}"

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split`` (deterministic; the generated splits share no entity, and validation questions
        search a collection of their own)."""
        check_split(split)
        assert self._splits is not None
        if split == "validation" and self.corpus is None and "validation" not in self._collections:
            self._generate_validation()
        hint = ("mark questions \"split\": \"validation\" in the questions file, or set the task option "
                "validation_fraction=F to move that share of its train questions there")
        return list(nonempty_split(self.name, split, self._splits[split], hint))

    @property
    def passages(self) -> list[Passage]:
        """The collection's passages."""
        return list(self._passages)

    def index(self, collection: str = "main") -> Index:
        """The BM25 index of a collection (``main``, or the generated knowledge base's ``validation`` one: a
        problem's ``meta["collection"]``), built on first use and shared by every environment and task."""
        if collection not in self._index:
            with self._lock:
                if collection not in self._index:
                    name = f"rag corpus file {self.corpus}" if self.corpus else "the generated knowledge base"
                    if collection not in self._collections:
                        raise ConfigError(f"rag has no collection {collection!r}")
                    key, passages = self._collections[collection]
                    self._index[collection] = shared_index(key, passages, name + (
                        "" if collection == "main" else f" ({collection})"))
        return self._index[collection]

    # ------------------------------------------------------------------ verifier
    def outcome(self, problem: Problem, answer: str) -> dict[str, float]:
        """``{"outcome", "em", "f1"}`` of an answer (and ``chars`` with ``metric="chars"``): the outcome is the
        one the ``metric`` option names. Whatever the metric, an episode is *correct* on an exact match."""
        answer = answer[:ANSWER_CHARS] if isinstance(answer, str) else ""
        answers = problem.meta["answers"]
        scores = {"em": exact_match(answer, answers), "f1": token_f1(answer, answers)}
        if self.metric == "chars":
            scores["chars"] = char_similarity(answer, answers)
        return {"outcome": scores[self.metric], **scores}

    def score(self, problem: Problem, completion: Any) -> float:
        """Outcome of the completion's first ``<answer>`` (0.0 without one), so it also scores a transcript."""
        if not isinstance(completion, str):
            return 0.0
        start = re.search(r"<answer>", completion, re.IGNORECASE)
        kind, answer = parse_turn(completion[start.start():]) if start else (None, "")
        return self.outcome(problem, answer)["outcome"] if kind == "answer" else 0.0

    def score_many(self, problems: Sequence[Problem], completions: Sequence[Any]) -> list[float]:
        """``score`` for each pair."""
        return [self.score(p, c) for p, c in zip(problems, completions)]

    # ------------------------------------------------------------------ demonstrations
    def demonstration_turns(self, problem: Problem) -> list[tuple[str, str]]:
        """The oracle episode as (agent turn, environment reply) pairs: each oracle query with its real
        feedback, then the reference answer. No self-report (a warm-up would teach a constant)."""
        env = self.make_env(max_turns=max(self.max_turns, len(problem.meta["queries"]) + 1))
        env.reset(problem)
        turns = []
        for query in problem.meta["queries"]:
            turn = f"<search>{query}</search>"
            turns.append((turn, env.step(turn)[0]))
        return turns + [(f"<answer>{problem.answer}</answer>", "")]

    def stepwise_demonstration(self, problem: Problem, confidence: Callable[[str], str], detour: str | None = None,
                               hop: int = 0) -> list[tuple[str, str, bool]]:
        """The oracle episode stating a confidence at the start of every turn (the ``report="steps"`` protocol), as
        (agent turn, environment reply, trained) triples. ``confidence(level)`` gives the value written for a
        level: ``start`` (nothing read yet), ``found`` (the last search returned what the next move needs: the
        next hop's subject, or the answer) or ``missed``. With a ``detour`` (:data:`DETOURS`, generated knowledge
        base only) the search of hop ``hop`` is first made wrong: ``relation`` asks another relation of the right
        subject, ``typo`` the right relation of the subject misspelled by one letter (whose results are about
        other entities); either is chosen so that its results miss the fact. That turn is context only (not
        ``trained``, so no wrong query is taught); the next, trained, states a ``missed`` confidence and searches
        the oracle query."""
        if self.report != "steps":
            raise ConfigError(f"stepwise demonstrations need the rag option report=steps (a confidence opens every "
                              f"turn), got report={self.report!r}")
        if detour is not None and detour not in DETOURS:
            raise ConfigError(f"rag detour must be one of {', '.join(DETOURS)}, got {detour!r}")
        queries = problem.meta["queries"]
        env = self.make_env(max_turns=2 * len(queries) + 2)
        env.reset(problem)
        out: list[tuple[str, str, bool]] = []
        level = "start"
        for h, (query, need) in enumerate(zip(queries, self._needs(problem))):
            if detour is not None and h == hop and (miss := self._detour(problem, detour, h)) is not None:
                turn = f"<confidence>{confidence(level)}</confidence><search>{miss}</search>"
                out.append((turn, env.step(turn)[0], False))
                level = "missed"
            turn = f"<confidence>{confidence(level)}</confidence><search>{query}</search>"
            feedback = env.step(turn)[0]
            out.append((turn, feedback, True))
            level = "found" if need(feedback) else "missed"
        return out + [(f"<confidence>{confidence(level)}</confidence><answer>{problem.answer}</answer>", "", True)]

    def _needs(self, problem: Problem) -> list[Callable[[str], bool]]:
        """Per oracle query: does a feedback text hold what the next move needs? On the generated knowledge base,
        the hop's fact (its object read out of the text); on a user's collection, a reference answer."""
        relations = problem.meta.get("relations")
        if not relations:
            answers = [normalize_answer(a) for a in problem.meta["answers"]]
            return [lambda text: any(a and a in normalize_answer(text) for a in answers)] * len(problem.meta["queries"])
        return [lambda text, r=RELATIONS[name], s=subject: r.read(text, s) is not None
                for subject, name in _hops(problem)]

    def _detour(self, problem: Problem, kind: str, hop: int = 0) -> str | None:
        """A wrong query for hop ``hop`` (see :meth:`stepwise_demonstration`) whose results miss the fact the hop
        needs; None when no candidate misses, the hop does not exist, or on a user's collection."""
        hops = _hops(problem) if problem.meta.get("relations") else []
        if not 0 <= hop < len(hops):
            return None
        subject, name = hops[hop]
        relation = RELATIONS[name]
        if kind == "relation":
            candidates = [f"{subject} {r.name}" for r in RELATIONS.values() if r.subject == relation.subject and r.name != name]
        else:
            candidates = [f"{subject[:i]}{c}{subject[i + 1:]} {name}" for i in range(1, len(subject))
                          for c in (VOWELS if subject[i] in VOWELS else CONSONANTS) if c != subject[i]]
        for query in candidates:
            index = self.index(problem.meta.get("collection", "main"))
            if relation.read(render(index.search(query, self.k), self.passage_chars), subject) is None:
                return query
        return None

    def demonstration(self, problem: Problem) -> str:
        """The oracle episode as one text (turns and feedback, the transcript after the prompt)."""
        return "".join(turn + feedback for turn, feedback in self.demonstration_turns(problem))

    def oracle_episode(self, problem: Problem) -> bool:
        """Play a scripted oracle agent through one episode; True when it gets reward 1 with enough searches.

        On the generated knowledge base the oracle reads: it searches ``SUBJECT RELATION`` for each hop and
        takes the next subject (finally the answer) out of the retrieved text, so it fails if retrieval
        misses. On a user's collection it searches the question and gives the first reference answer."""
        env = self.make_env()
        env.reset(problem)
        relations = problem.meta.get("relations")
        answer: str | None = problem.answer
        if relations:
            answer = problem.meta["entity"]
            for name in relations:
                feedback, _, done, _ = env.step(f"<search>{answer} {name}</search>")
                answer = None if done else RELATIONS[name].read(feedback, answer)
                if answer is None:
                    return False
        else:
            for query in problem.meta["queries"]:
                if env.step(f"<search>{query}</search>")[2]:
                    return False
        _, reward, done, info = env.step(f"<answer>{answer}</answer>")
        enough = info.get("searches", 0) >= (len(relations) if relations else 1)
        return bool(done) and reward == 1.0 and enough and not info.get("premature")

    def teacher_prompt(self, problem: Problem) -> str:
        """The prompt with the reference answer in context, for a self-teacher."""
        return f"reference: {problem.answer}\n{problem.prompt}"

    def make_env(self, max_turns: int | None = None) -> RAGEnv:
        """A multi-turn environment (``max_turns`` agent turns, default the task's) sharing the index."""
        return RAGEnv(self, max_turns or self.max_turns)


class RAGEnv:
    """The rag turn protocol over one problem (see the module docstring and docs/tasks.md)."""

    def __init__(self, task: RAGTask, max_turns: int):
        self.task, self.max_turns, self.index = task, max_turns, task.index()
        self.problem: Problem | None = None
        self.turns, self.searches, self.done = 0, 0, True
        self.found: set[int] = set()  # hops whose fact a search has returned (search_credit)
        self.needs: list[Callable[[str], bool]] = []

    def reset(self, problem: Problem) -> str:
        """Start an episode; return the prompt."""
        self.problem, self.turns, self.searches, self.done = problem, 0, 0, False
        self.index = self.task.index(problem.meta.get("collection", "main"))
        self.found = set()
        self.needs = self.task._needs(problem) if self.task.search_credit > 0 else []
        return problem.prompt

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One agent turn -> (feedback text, reward, done, info). The reward is the outcome, at the end; with the
        ``search_credit`` option a search whose results first hold what one of the question's hops needs (the test
        of :meth:`RAGTask.stepwise_demonstration`: the hop's fact, or on a user's collection a reference answer)
        also earns ``search_credit / hops`` (so an episode's rewards sum to at most ``1 + search_credit``)."""
        if self.done or self.problem is None:
            raise RuntimeError("step() called on a finished episode; call reset(problem) first")
        self.turns += 1
        step_reward = 0.0
        kind, content = parse_turn(text)
        report = self_report(text) if isinstance(text, str) else {}
        hops = int(self.problem.meta.get("hops", 1))
        if kind == "answer":
            scores = self.task.outcome(self.problem, content)
            info = {"kind": "answer", **scores, "correct": scores["em"] == 1.0, "answered": True, "answer": content,
                    "turns": self.turns, "searches": self.searches, "hops": hops,
                    "premature": scores["em"] < 1.0 and self.searches < hops, **report}
            if self.needs:
                info["found_hops"] = len(self.found)
            self.done = True
            return "", float(scores["outcome"]), True, info
        if kind == "search":
            self.searches += 1
            found = self.index.search(content, self.task.k)
            feedback = render(found, self.task.passage_chars)
            info = {"kind": "search", "query": content, "results": len(found), "searches": self.searches}
            if self.needs:
                new = {h for h, need in enumerate(self.needs) if need(feedback)} - self.found
                self.found |= new
                step_reward = self.task.search_credit * len(new) / len(self.needs)
        else:
            feedback, info = INVALID, {"kind": "invalid", "error": True}
        info.update(turns=self.turns, **report)
        if self.needs:
            info["found_hops"] = len(self.found)
        if self.turns >= self.max_turns:
            self.done = True
            return "", step_reward, True, {**info, "outcome": 0.0, "em": 0.0, "f1": 0.0, "correct": False, "answered": False,
                                   "truncated": True, "searches": self.searches, "hops": hops, "premature": False}
        return feedback, step_reward, False, info
