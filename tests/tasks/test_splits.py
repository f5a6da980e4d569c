"""The validation split: disjoint from train and heldout in every task, and adding it changed neither of them."""

from __future__ import annotations

import hashlib

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.base import SPLITS, get_task, split_problems

# sha256 (first 16 hex digits) of "id\tprompt\tanswer" per problem, one per line, and the count: computed from each
# task's train and heldout problems before the validation split existed. Committed results were trained and scored
# on exactly these problems.
BEFORE = {
    ("arith", ()): {"train": (5000, "5b861fd7427ffbdb"), "heldout": (500, "6b4bd4e84906e87d")},
    ("arith", (("digits", 3),)): {"train": (5000, "af3071fccd4b43f9"), "heldout": (500, "83e296b91ef05fe0")},
    ("text2sql", ()): {"train": (608, "835cb16beeaceb0f"), "heldout": (147, "de11683142ca95bb")},
    ("rag", ()): {"train": (760, "5c17bed18feed4c0"), "heldout": (200, "76786b4a7c6f323a")},
    ("codegen", ()): {"train": (762, "1f498d9d401ec63c"), "heldout": (207, "ecbf6a476b2870d7")},
    ("humaneval", ()): {"train": (82, "45e9ad2f51f8926b"), "heldout": (82, "a34b8b589b661fc5")},
}


def _digest(problems) -> tuple[int, str]:
    text = "\n".join(f"{p.id}\t{p.prompt}\t{p.answer}" for p in problems)
    return len(problems), hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name,options", list(BEFORE), ids=lambda x: str(x))
def test_train_and_heldout_are_the_problems_of_before(name, options):
    task = get_task(name, **dict(options))
    task.problems("validation") if name not in ("codegen", "humaneval") else None  # building it changes nothing
    for split, expected in BEFORE[(name, options)].items():
        assert _digest(task.problems(split)) == expected, split


@pytest.mark.parametrize("name,options", [("arith", {}), ("arith", {"digits": 3}), ("text2sql", {}), ("rag", {}),
                                          ("codegen", {"validation_fraction": 0.2}),
                                          ("humaneval", {"validation_fraction": 0.2})], ids=str)
def test_the_three_splits_are_disjoint_and_deterministic(name, options):
    task = get_task(name, **options)
    ids = {s: [p.id for p in task.problems(s)] for s in SPLITS}
    assert all(ids[s] for s in SPLITS)
    assert len(set(ids["validation"])) == len(ids["validation"])
    assert not set(ids["validation"]) & set(ids["train"]) and not set(ids["validation"]) & set(ids["heldout"])
    assert not set(ids["train"]) & set(ids["heldout"])
    assert [p.id for p in get_task(name, **options).problems("validation")] == ids["validation"]


def test_carved_validation_takes_its_share_from_train_only():
    plain, carved = get_task("codegen"), get_task("codegen", validation_fraction=0.2)
    assert [p.id for p in carved.problems("heldout")] == [p.id for p in plain.problems("heldout")]
    train = [p.id for p in plain.problems("train")]
    kept = [p.id for p in carved.problems("train")]
    moved = [p.id for p in carved.problems("validation")]
    assert sorted(kept + moved) == sorted(train)
    assert 0.1 < len(moved) / len(train) < 0.3


def test_arith_validation_takes_train_side_expressions_the_train_sample_left_out():
    task = get_task("arith", n_train=100)
    train, validation = task.problems("train"), task.problems("validation")
    assert len(validation) == 500
    # the first 100 of the same train-side order are train; the next 500 are validation
    longer = get_task("arith", n_train=600).problems("train")
    assert [p.id for p in longer] == [p.id for p in train + validation]


def test_rag_validation_questions_search_a_collection_with_their_own_entities():
    task = get_task("rag")
    validation, heldout = task.problems("validation"), task.problems("heldout")
    assert all(p.meta["collection"] == "validation" for p in validation)
    assert all("collection" not in p.meta for p in heldout + task.problems("train"))
    entities = {e for p in task.problems("train") + heldout for e in p.meta["entities"]}
    assert not entities & {e for p in validation for e in p.meta["entities"]}
    # the scripted oracle searches, reads and answers: the validation facts are in the validation collection only
    assert all(task.oracle_episode(p) for p in validation[:60])
    main = task.index("main")
    assert not any(validation[0].meta["entity"] in p.text for p in main.search(validation[0].meta["queries"][0], 5))


def test_rag_file_questions_go_to_validation_when_marked_or_carved(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"id": "p{i}", "text": "fact {i} is {i * 7}"}}\n' for i in range(40)))
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "v", "question": "fact 1?", "answers": ["7"], "split": "validation"}\n'
                         + "".join(f'{{"id": "q{i}", "question": "fact {i}?", "answers": ["{i * 7}"]}}\n'
                                   for i in range(2, 40)))
    task = get_task("rag", corpus=str(corpus), questions=str(questions))
    assert [p.id for p in task.problems("validation")] == ["rag:v"]
    carved = get_task("rag", corpus=str(corpus), questions=str(questions), validation_fraction=0.3)
    assert len(carved.problems("validation")) > 1
    assert [p.id for p in carved.problems("heldout")] == [p.id for p in task.problems("heldout")]


@pytest.mark.parametrize("name", ["codegen", "humaneval"])
def test_a_task_without_validation_problems_says_how_to_get_them(name):
    task = get_task(name)
    with pytest.raises(ConfigError, match="validation_fraction"):
        task.problems("validation")
    assert split_problems(task, "validation") == []
    with pytest.raises(ConfigError, match="validation_fraction must be a number"):
        get_task(name, validation_fraction=1.5)


def test_a_rag_knowledge_base_too_large_for_a_validation_collection_is_refused_when_asked():
    task = get_task("rag", n_companies=1500)  # train and heldout are as before
    with pytest.raises(ConfigError, match="too large for a validation collection"):
        task.problems("validation")


def test_an_unknown_split_names_the_three():
    with pytest.raises(ConfigError, match="train, validation, heldout"):
        get_task("arith").problems("test")
