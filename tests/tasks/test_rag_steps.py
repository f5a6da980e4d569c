"""rag demonstrations that state a confidence on every turn (the per-step confidence of the warm-up)."""

from __future__ import annotations

import json

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.base import get_task
from reflectrl.tasks.rag import RAGTask
from reflectrl.tasks.rag_kb import RELATIONS

pytestmark = pytest.mark.timeout(120)
LEVELS = {"start": "0.5", "found": "0.9", "missed": "0.2"}


@pytest.fixture(scope="module")
def task() -> RAGTask:
    return get_task("rag", report="steps")


def _play(task: RAGTask, problem, turns):
    """Play the turns through a fresh environment; the infos of every step."""
    env = task.make_env(max_turns=len(turns))
    env.reset(problem)
    infos = []
    for turn, feedback, _ in turns:
        reply, _, _, info = env.step(turn)
        assert reply == feedback  # the demonstration's replies are the environment's own
        infos.append(info)
    return infos


def test_oracle_turns_state_start_then_found(task):
    p = next(p for p in task.problems("heldout") if p.meta["hops"] == 2)
    turns = task.stepwise_demonstration(p, LEVELS.get)
    a, b = p.meta["queries"]
    assert [t for t, _, _ in turns] == [f"<confidence>0.5</confidence><search>{a}</search>",
                                        f"<confidence>0.9</confidence><search>{b}</search>",
                                        f"<confidence>0.9</confidence><answer>{p.answer}</answer>"]
    assert all(trained for _, _, trained in turns)
    infos = _play(task, p, turns)
    assert [i["confidence"] for i in infos] == [0.5, 0.9, 0.9]  # the env parses every turn's confidence
    assert infos[-1]["correct"] and not infos[-1]["premature"]


@pytest.mark.parametrize("kind", ["relation", "typo"])
def test_a_detour_misses_is_not_trained_and_is_followed_by_a_low_confidence(task, kind):
    p = next(p for p in task.problems("train") if p.meta["hops"] == 2 and task._detour(p, kind, 1) is not None)
    turns = task.stepwise_demonstration(p, LEVELS.get, detour=kind, hop=1)
    (first, _, t0), (miss, feedback, t1), (again, _, t2), (answer, _, t3) = turns
    bridge = RELATIONS[p.meta["relations"][0]].read(turns[0][1], p.meta["entity"])  # hop 2's subject
    relation = RELATIONS[p.meta["relations"][1]]
    assert [t0, t1, t2, t3] == [True, False, True, True]
    assert first == f"<confidence>0.5</confidence><search>{p.meta['queries'][0]}</search>"
    assert relation.read(feedback, bridge) is None  # the detour's results lack the fact
    query = miss.split("<search>")[1].split("</search>")[0]
    if kind == "relation":
        assert query.startswith(bridge + " ") and query != p.meta["queries"][1]
    else:  # the right relation, the subject off by one letter
        name, rel = query.split(" ")
        assert rel == p.meta["relations"][1] and len(name) == len(bridge) and name[0] == bridge[0]
        assert sum(a != b for a, b in zip(name, bridge)) == 1
    assert miss.startswith("<confidence>0.9</confidence>")  # stated before the detour's results were read
    assert again == f"<confidence>0.2</confidence><search>{p.meta['queries'][1]}</search>"
    assert answer == f"<confidence>0.9</confidence><answer>{p.answer}</answer>"
    assert _play(task, p, turns)[-1]["correct"]
    with pytest.raises(ConfigError, match="detour must be one of"):
        task.stepwise_demonstration(p, LEVELS.get, detour="swap")


def test_every_stepwise_demonstration_solves_its_problem(task):
    for split in ("train", "heldout"):
        for p in task.problems(split):
            for detour in (None, "relation", "typo"):
                for hop in range(p.meta["hops"]):
                    turns = task.stepwise_demonstration(p, LEVELS.get, detour, hop)
                    assert task.score(p, "".join(t + f for t, f, _ in turns)) == 1.0
                    assert len(turns) <= task.max_turns  # a detour's two-hop episode fits the turn limit
                    assert (detour is None) == all(trained for _, _, trained in turns) or task._detour(p, detour, hop) is None


def test_a_user_collection_has_no_detour_and_reads_the_answer(tmp_path):
    corpus, questions = tmp_path / "c.jsonl", tmp_path / "q.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "text": "The Eiffel Tower is in Paris."}) + "\n"
                      + json.dumps({"id": "d2", "text": "Rivers flow."}) + "\n")
    questions.write_text(json.dumps({"id": "q1", "question": "Where is the Eiffel Tower?", "answers": ["Paris"]}) + "\n"
                         + json.dumps({"id": "q2", "question": "Rivers?", "answers": ["Seine"]}) + "\n")
    t = RAGTask(corpus=str(corpus), questions=str(questions), k=1, heldout_fraction=0.0, report="steps")
    found, missed = t.problems("train")
    assert t._detour(found, "typo") is None and t._detour(found, "relation") is None
    assert [x for x, _, _ in t.stepwise_demonstration(found, LEVELS.get, detour="typo")] == [
        "<confidence>0.5</confidence><search>Where is the Eiffel Tower?</search>",
        "<confidence>0.9</confidence><answer>Paris</answer>"]
    # the retrieved passage does not hold the answer: the answer turn states the low confidence
    assert t.stepwise_demonstration(missed, LEVELS.get)[-1][0] == "<confidence>0.2</confidence><answer>Seine</answer>"


def test_the_steps_protocol(task):
    """A confidence opens every turn, so no turn ends at a confidence tag; the other reports refuse stepwise
    demonstrations (their stop sequence would cut a search turn at its confidence)."""
    assert task.stop_sequences == ("</search>", "</answer>")
    assert "Begin each turn with <confidence>P</confidence>" in task.problems("train")[0].prompt
    with pytest.raises(ConfigError, match="report=steps"):
        RAGTask().stepwise_demonstration(task.problems("train")[0], LEVELS.get)
