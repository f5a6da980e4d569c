"""benchmarks/rag_failures.py: each wrong episode falls in the first failure that holds; the table renders shares."""

import json

import pytest

from reflectrl.tasks.rag import RAGTask

from .helpers import benchmark_script


@pytest.fixture(scope="module")
def mod():
    return benchmark_script("rag_failures")


def _episode(task: RAGTask, problem, queries: list[str], answer: str | None) -> list[dict]:
    """The infos of an episode that searches ``queries`` then answers (or not, with None)."""
    env = task.make_env(max_turns=len(queries) + 1)
    env.reset(problem)
    infos = [env.step(f"<search>{q}</search>")[3] for q in queries]
    if answer is not None:
        infos.append(env.step(f"<answer>{answer}</answer>")[3])
    return infos


def test_categories_of_hand_built_episodes(mod):
    t = RAGTask(n_companies=4)
    p = next(q for q in t.problems("train") if q.meta["template"] == "p_employer_city")
    first, second = p.meta["queries"]
    assert mod.category(t, p, _episode(t, p, [first], None)) == "no answer"
    assert mod.category(t, p, []) == "no answer"
    assert mod.category(t, p, _episode(t, p, ["zzqx works"], "Lima")) == "missed fact 1"
    assert mod.category(t, p, _episode(t, p, [first], "Lima")) == "missed fact 2"
    # every fact found, in either order; the answer is still wrong
    wrong = next(c for c in ("Lima", "Oslo") if c != p.answer)
    assert mod.category(t, p, _episode(t, p, [second, first], wrong)) == "found, wrong answer"


def test_render_gives_shares_and_dashes(mod, tmp_path, monkeypatch):
    row = {"model": "m", "n": 4, "greedy": 0.25, "sampled": 0.125, "pass@8": 0.5, "samples": 8,
           "failures": {"no answer": 0.0, "missed fact 1": 0.5, "missed fact 2": 0.0, "found, wrong answer": 0.25},
           "by_kind": {"city": 1.0, "name": 0.0, "year": None}}
    (tmp_path / "rf.json").write_text(json.dumps({"models": [row]}))
    monkeypatch.setattr(mod, "RES", tmp_path)
    table = mod.render("rf.json")
    assert "| `m` | 25% | 12% | 50% | 0% | 50% | 0% | 25% | 100% | 0% | - |" in table
    assert "The first 4 held-out questions" in table
