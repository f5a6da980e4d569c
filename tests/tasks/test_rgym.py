"""``reasoning-gym``: a generator's problems, split by seed and disjoint, scored by its own ``score_answer``."""

from __future__ import annotations

import json

import pytest

from reflectrl.cli.tasks import main
from reflectrl.errors import ConfigError
from reflectrl.tasks.base import SPLITS, get_task

pytest.importorskip("reasoning_gym")


def test_validate_and_disjoint_deterministic_splits(capsys):
    assert main(["validate", "reasoning-gym", "--set", "dataset=chain_sum", "--set", "n_train=300", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["total"] > 600
    task = get_task("reasoning-gym", dataset="chain_sum", n_train=300)
    questions = {s: [p.meta["question"] for p in task.problems(s)] for s in SPLITS}
    assert sum(map(len, questions.values())) == len(set().union(*map(set, questions.values())))  # disjoint
    again = get_task("reasoning-gym", dataset="chain_sum", n_train=300)
    assert {s: [p.id for p in again.problems(s)] for s in SPLITS} == {s: [p.id for p in task.problems(s)]
                                                                      for s in SPLITS}
    other = get_task("reasoning-gym", dataset="chain_sum", n_train=300, seed=1)
    assert [p.meta["question"] for p in other.problems("heldout")] != questions["heldout"]


def test_scores_come_from_the_generator():
    task = get_task("reasoning-gym", dataset="basic_arithmetic", n_train=20, n_validation=5, n_heldout=5,
                    config={"max_terms": 3})
    p = task.problems("heldout")[0]
    right, wrong = p.answer, str(int(p.answer) + 1)
    assert task.score(p, right) == 1.0 and task.score(p, f"<answer>{right}</answer>") == 1.0
    assert task.score(p, wrong) == 0.0 and task.score(p, "") == 0.0 and task.score(p, None) == 0.0
    assert task.chat_prompt(p) == f"{p.meta['question'].strip()} Reply with only the answer."
    boxed = get_task("reasoning-gym", dataset="basic_arithmetic", n_train=5, n_validation=1, n_heldout=1,
                     extract="boxed")
    q = boxed.problems("train")[0]
    assert boxed.demonstration(q) == f"\\boxed{{{q.answer}}}" and boxed.score(q, q.answer) == 0.0


@pytest.mark.parametrize("options, message", [
    ({}, "needs a generator: --set dataset=NAME"),
    ({"dataset": "no_such_generator"}, "reasoning-gym dataset 'no_such_generator'"),
    ({"dataset": "chain_sum", "config": {"bogus": 1}}, "has no such option"),
    ({"dataset": "chain_sum", "n_train": -1}, "must be integers >= 0"),
])
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        get_task("reasoning-gym", **options)
