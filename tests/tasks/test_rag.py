"""rag: the generated knowledge base, BM25 retrieval, the turn protocol, user corpora and validation."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from reflectrl.cli.tasks import main, validate
from reflectrl.errors import ConfigError
from reflectrl.tasks.base import get_task
from reflectrl.tasks.rag import INVALID, NO_RESULTS, RAGTask, char_similarity, exact_match, normalize_answer, parse_turn, token_f1
from reflectrl.tasks.rag_kb import generate_kb

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def task() -> RAGTask:
    return get_task("rag")


def _find(task: RAGTask, template: str, split: str = "train"):
    return next(p for p in task.problems(split) if p.meta["template"] == template)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ the generated knowledge base
def test_same_seed_same_problems_and_passages():
    a, b, c = RAGTask(), RAGTask(), RAGTask(seed=1)
    for split in ("train", "heldout"):
        assert [(p.id, p.prompt, p.answer, p.meta) for p in a.problems(split)] == \
               [(p.id, p.prompt, p.answer, p.meta) for p in b.problems(split)]
    assert a.passages == b.passages and a.passages != c.passages
    assert [p.id for p in a.problems("train")] != [p.id for p in c.problems("train")]
    assert generate_kb(0, 5, 2).passages == generate_kb(0, 5, 2).passages


def test_splits_are_disjoint_by_entity(task):
    train, held = task.problems("train"), task.problems("heldout")
    # 48 clusters of one company and 3 people; 10 question templates, 5 per person and 5 per company
    assert len(train) + len(held) == 48 * 3 * 5 + 48 * 5 and len(held) == round(0.2 * 48) * 20
    assert len({p.id for p in train + held}) == len(train) + len(held)
    seen = {e for p in train for e in p.meta["entities"]}
    assert seen and not seen & {e for p in held for e in p.meta["entities"]}
    assert not {p.meta["cluster"] for p in train} & {p.meta["cluster"] for p in held}
    # every held-out subject, bridge and entity answer is absent from all train questions
    train_text = " ".join(p.prompt for p in train)
    assert not any(f" {e} " in f" {train_text} " or f"{e}'s" in train_text for p in held for e in p.meta["entities"])
    hops = {p.meta["hops"] for p in train + held}
    assert hops == {1, 2} and sum(p.meta["hops"] == 2 for p in held) == round(0.2 * 48) * 8


def test_index_returns_the_supporting_passage_for_oracle_queries(task):
    index, text = task.index(), {p.id: p.text for p in task.passages}
    for p in task.problems("train") + task.problems("heldout"):
        assert len(p.meta["queries"]) == len(p.meta["support"]) == p.meta["hops"]
        for query, support in zip(p.meta["queries"], p.meta["support"]):
            found = index.search(query, task.k)
            assert found[0].id == support, (query, [f.text for f in found], text[support])
    # every person also has a distractor passage naming another city
    p = _find(task, "p_city")
    person = p.meta["entity"]
    distractor = index.search(f"{person} visited", 1)[0].text
    assert distractor.startswith(f"{person} visited ") and p.answer not in distractor
    assert any(x.text == distractor for x in index.search(f"{person} city", 5))  # a sloppy query may read it


def test_episodes_are_short_enough_for_a_character_level_model(task):
    lengths = [len(p.prompt) + len(task.demonstration(p)) + len("<confidence>0.9</confidence>")
               for p in task.problems("train") + task.problems("heldout")]
    assert max(lengths) <= 450
    short = RAGTask(instructions=False)
    assert max(len(p.prompt) + len(short.demonstration(p)) for p in short.problems("train")) <= 300


# ------------------------------------------------------------------ oracle and validation
def test_oracle_solves_every_problem_of_both_splits(task, capsys):
    report = validate(task, ("train", "heldout"))
    assert report["ok"] and report["passed"] == report["total"] == 960
    assert all(s["failed"] == [] for s in report["splits"].values())
    assert main(["validate", "rag", "--split", "heldout", "--set", "k=3"]) == 0
    assert "200/200" in capsys.readouterr().out
    assert main(["show", "rag", "-n", "1"]) == 0
    assert "<search>" in capsys.readouterr().out


def test_oracle_fails_when_the_episode_cannot_be_solved():
    # one turn allows no search before answering: the reading oracle cannot answer a two-hop question
    one = RAGTask(max_turns=1)
    p = _find(one, "p_employer_city")
    assert not one.oracle_episode(p)
    assert not validate(one, ("heldout",))["ok"]


def test_demonstrations(task):
    p = _find(task, "c_founder_city", "heldout")
    turns = task.demonstration_turns(p)
    assert [t for t, _ in turns] == [f"<search>{q}</search>" for q in p.meta["queries"]] + [f"<answer>{p.answer}</answer>"]
    env = task.make_env()
    env.reset(p)
    assert [env.step(t)[0] for t, _ in turns[:-1]] == [f for _, f in turns[:-1]]  # the real feedback
    assert task.score(p, task.demonstration(p)) == 1.0
    assert task.demonstration(p).startswith("<search>") and "<confidence>" not in task.demonstration(p)
    assert task.teacher_prompt(p) == f"reference: {p.answer}\n{p.prompt}"


# ------------------------------------------------------------------ the turn protocol
def test_search_feedback_answer_and_info(task):
    p = _find(task, "p_employer_city")
    person, company = p.meta["entity"], p.meta["entities"][1]
    env = task.make_env()
    assert env.reset(p) == p.prompt and p.prompt.endswith(f"question: {p.meta['question']}\n")
    text, reward, done, info = env.step(f"<confidence>0.3</confidence><search>{person} works</search>")
    assert text.startswith("\n") and text.endswith("\n") and f"{person} works at {company}." in text.splitlines()
    assert reward == 0.0 and not done
    assert info == {"kind": "search", "query": f"{person} works", "results": 2, "searches": 1, "turns": 1,
                    "confidence": 0.3}
    text, _, done, _ = env.step("I think I know")
    assert text == INVALID and not done
    text, _, _, info = env.step(f"<search>{company} based")  # closing tag dropped by a stop sequence
    assert f"{company} is based in {p.answer}." in text and info["searches"] == 2
    text, reward, done, info = env.step(f"<answer>the {p.answer.upper()}!</answer><confidence>0.9")
    assert (text, reward, done) == ("", 1.0, True)
    assert info["outcome"] == info["em"] == info["f1"] == 1.0 and info["correct"] and info["answered"]
    assert info["searches"] == info["hops"] == 2 and not info["premature"] and info["confidence"] == 0.9
    assert info["turns"] == 4
    with pytest.raises(RuntimeError):
        env.step("<answer>x</answer>")


def test_premature_and_truncated(task):
    p = _find(task, "p_employer_year")
    env = task.make_env()
    env.reset(p)
    env.step(f"<search>{p.meta['entity']} works</search>")
    _, reward, done, info = env.step("<answer>1900x</answer><reflect>solved</reflect>")
    assert done and reward == 0.0 and info["premature"] and info["reflection"] == 1 and not info["correct"]
    env.reset(p)  # a right answer without searching is not premature
    assert env.step(f"<answer>{p.answer}</answer>")[3]["premature"] is False
    env.reset(p)
    for turn in ("<search>a b</search>", "<search>c d</search>", "<search>e f</search>"):
        env.step(turn)
    text, reward, done, info = env.step(f"<search>{p.answer}</search>")
    assert (text, reward, done) == ("", 0.0, True)
    assert info["truncated"] and not info["answered"] and info["outcome"] == 0.0 and info["turns"] == 4


def test_a_search_that_matches_nothing_returns_no_results(task):
    env = task.make_env()
    env.reset(task.problems("train")[0])
    for query in ("zzzqqq xxyyzz", "", "the of a", "!!!", "\u00e9t\u00e9 \u4e2d\u6587", "x" * 100_000):
        text, reward, done, info = env.step(f"<search>{query}</search>")
        assert text == NO_RESULTS and info["results"] == 0 and reward == 0.0 and not done
        env.reset(task.problems("train")[0])
    assert task.index().search("", 5) == []


def test_the_outcome_never_reaches_the_agent(task):
    """The feedback of a search depends only on the query: a right and a wrong episode see the same texts."""
    for p in (_find(task, "c_founder_born"), _find(task, "p_city", "heldout")):
        seen = {}
        for answer in (p.answer, "wrong"):
            env = task.make_env()
            texts = [env.reset(p)] + [env.step(f"<search>{q}</search>")[0] for q in p.meta["queries"]]
            final = env.step(f"<answer>{answer}</answer>")
            texts.append(final[0])
            seen[final[1]] = texts
        assert set(seen) == {0.0, 1.0} and seen[0.0] == seen[1.0]
        assert all(w not in t.lower() for t in seen[1.0] for w in ("outcome", "correct", "reward", "right"))
        assert seen[1.0][-1] == ""


def test_parse_turn_and_answer_metrics():
    assert parse_turn("<reflect>solved</reflect><search> a b </search> junk") == ("search", "a b")
    assert parse_turn("<ANSWER>Lima") == ("answer", "Lima")
    assert parse_turn("<answer>x</answer><search>y</search>") == ("answer", "x")
    assert parse_turn(None) == (None, "") and parse_turn("plain") == (None, "")
    assert normalize_answer("  The Lima, Peru! ") == "lima peru"
    assert exact_match("the Oslo.", ["Paris", "oslo"]) == 1.0 and exact_match("Oslo city", ["Oslo"]) == 0.0
    # "new york city" vs "New York": 2 shared tokens, precision 2/3, recall 1 -> F1 = 2 * (2/3) / (5/3) = 0.8
    assert token_f1("new york city", ["New York", "Boston"]) == pytest.approx(0.8)
    assert token_f1("the", ["a"]) == 1.0 and token_f1("", ["Lima"]) == 0.0


def test_f1_metric_option():
    t = RAGTask(metric="f1", n_companies=4)
    p = _find(t, "c_founder")
    env = t.make_env()
    env.reset(p)
    _, reward, _, info = env.step(f"<answer>{p.answer} Smith</answer>")
    assert reward == pytest.approx(2 / 3) and info["f1"] == pytest.approx(2 / 3) and info["em"] == 0.0
    assert not info["correct"] and t.score(p, f"<answer>{p.answer}</answer>") == 1.0


def test_char_similarity_by_hand():
    # difflib's ratio 2M/T: "fedad" vs "fedam" share the block "feda" (M=4) of T=10 characters -> 0.8
    assert char_similarity("Fedad", ["Fedam"]) == pytest.approx(0.8)
    # "1977" vs "1979": block "197" (M=3), T=8 -> 0.75; "rome" vs "riga": "r" (M=1), T=8 -> 0.25
    assert char_similarity("1977", ["1979"]) == pytest.approx(0.75)
    assert char_similarity("Rome", ["Riga", "Oslo"]) == pytest.approx(0.25)
    assert char_similarity("the Lima.", ["Oslo", "lima"]) == 1.0 and char_similarity("", ["Lima"]) == 0.0
    assert char_similarity("", [""]) == 1.0


def test_chars_metric_option_rewards_near_copies_and_counts_only_exact_ones_correct():
    t = RAGTask(metric="chars", n_companies=4)
    p = _find(t, "c_founder")
    env = t.make_env()
    env.reset(p)
    near = p.answer[:-1] + ("a" if p.answer[-1] != "a" else "e")  # one letter wrong
    _, reward, _, info = env.step(f"<answer>{near}</answer>")
    expected = 2 * (len(p.answer) - 1) / (2 * len(p.answer))
    assert reward == pytest.approx(expected) and info["chars"] == pytest.approx(expected)
    assert info["em"] == 0.0 and not info["correct"] and info["premature"]  # no search: answered wrong too early
    assert t.score(p, f"<answer>{p.answer}</answer>") == 1.0
    with pytest.raises(ConfigError, match="em, f1, chars"):
        RAGTask(metric="bleu", n_companies=2)


def test_stop_sequences_and_prompts():
    assert RAGTask(report="off", n_companies=2).stop_sequences == ("</search>", "</answer>")
    assert RAGTask(n_companies=2).stop_sequences == ("</search>", "</confidence>")
    assert RAGTask(report="reflect", n_companies=2).stop_sequences == ("</search>", "</reflect>")
    assert "<confidence>" in RAGTask(n_companies=2).problems("train")[0].prompt
    assert "<reflect>" in RAGTask(report="reflect", n_companies=2).problems("train")[0].prompt
    bare = RAGTask(instructions=False, n_companies=2).problems("train")[0].prompt
    assert bare.startswith("question: ") and bare.count("\n") == 1


@pytest.mark.parametrize("options, match", [
    ({"metric": "bleu"}, "metric"), ({"report": "inline"}, "report"), ({"k": 0}, "k must"),
    ({"max_turns": "4"}, "max_turns"), ({"heldout_fraction": 1.5}, "heldout_fraction"),
    ({"corpus": "c.jsonl"}, "both corpus"), ({"people": True}, "people"), ({"instructions": "no"}, "instructions"),
    ({"n_companies": 2000, "people": 3}, "too large: the generated names allow at most 4800 persons")])
def test_bad_options(options, match):
    with pytest.raises(ConfigError, match=match):
        RAGTask(**options)


def test_boolean_options_from_the_command_line():
    """``--set instructions=False`` (Python's spelling) is the boolean, as JSON's ``false`` is."""
    from reflectrl.tasks.base import parse_options

    assert parse_options(["instructions=False", "a=true", "b=FALSE", "c=no", "d=3"]) == {
        "instructions": False, "a": True, "b": False, "c": "no", "d": 3}
    assert get_task("rag", **parse_options(["instructions=False"])).problems("train")[0].prompt.startswith("question:")


# ------------------------------------------------------------------ sharing and speed
def test_index_is_shared_and_thread_safe(task):
    assert task.make_env().index is task.make_env().index is RAGTask().index()
    queries = [q for p in task.problems("train")[:300] for q in p.meta["queries"]] + ["nothing here", "Lima", "1990"]
    expected = [[x.id for x in task.index().search(q, 3)] for q in queries]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: [x.id for x in task.index().search(q, 3)], queries * 4))
    assert got == expected * 4


def test_env_steps_are_fast(task):
    problems = task.problems("train")[:50]
    env = task.make_env(max_turns=10)
    steps, t0 = 0, time.perf_counter()
    for _ in range(10):
        for p in problems:
            env.reset(p)
            for q in p.meta["queries"]:
                env.step(f"<search>{q}</search>")
            env.step(f"<answer>{p.answer}</answer><confidence>0.5")
            steps += len(p.meta["queries"]) + 1
    per_step = (time.perf_counter() - t0) / steps
    assert per_step < 2e-3, f"{per_step * 1e6:.0f} us per step"  # about 0.1 ms on one shared core


# ------------------------------------------------------------------ a user's corpus
def _write(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def user_files(tmp_path):
    corpus = _write(tmp_path / "corpus.jsonl", [
        {"id": "d1", "text": "The Eiffel Tower is in Paris."},
        {"id": 2, "title": "Danube", "text": "The Danube flows\n through Vienna and Budapest."},
        "",
        {"id": "d3", "text": "Mount Fuji is the highest mountain in Japan."}])
    questions = _write(tmp_path / "questions.jsonl", [
        {"id": "q1", "question": "Where is the Eiffel Tower?", "answers": ["Paris"], "split": "train"},
        {"id": "q2", "question": "Which river flows through Vienna?", "answers": ["Danube", "the Danube river"],
         "hops": 1, "split": "heldout"},
        {"id": 3, "question": "What is the highest mountain in Japan?", "answers": ["Mount Fuji"], "split": "train"}])
    return corpus, questions


def test_user_corpus_and_questions(user_files, capsys):
    corpus, questions = user_files
    t = RAGTask(corpus=corpus, questions=questions, k=1)
    assert [p.id for p in t.problems("train")] == ["rag:q1", "rag:3"] and [p.id for p in t.problems("heldout")] == ["rag:q2"]
    assert t.passages[1].text == "Danube: The Danube flows through Vienna and Budapest."
    assert [x.id for x in t.index().search("river Vienna", 2)] == ["2"]
    env = t.make_env()
    p = t.problems("heldout")[0]
    env.reset(p)
    assert env.step("<search>Vienna</search>")[0] == "\nDanube: The Danube flows through Vienna and Budapest.\n"
    assert env.step("<answer>danube</answer>")[1] == 1.0
    assert validate(t, ("train", "heldout"))["ok"]
    assert main(["validate", "rag", "--set", f"corpus={corpus}", "--set", f"questions={questions}"]) == 0
    assert "3/3 pass" in capsys.readouterr().out


def test_user_questions_without_split_are_hashed_deterministically(tmp_path, user_files):
    corpus, _ = user_files
    rows = [{"id": f"q{i}", "question": f"question {i}?", "answers": ["x"]} for i in range(200)]
    questions = _write(tmp_path / "q.jsonl", rows)
    a = RAGTask(corpus=corpus, questions=questions, heldout_fraction=0.25)
    b = RAGTask(corpus=corpus, questions=questions, heldout_fraction=0.25)
    held = [p.id for p in a.problems("heldout")]
    assert held == [p.id for p in b.problems("heldout")] and 25 <= len(held) <= 75
    assert not set(held) & {p.id for p in a.problems("train")}


@pytest.mark.parametrize("which, rows, match", [
    ("corpus", [{"id": "a", "text": "ok"}, '{"id": "b", "text": '], r"line 2: not JSON"),
    ("corpus", [{"id": "a", "text": "ok"}, {"id": "b"}], r"line 2: missing field 'text'"),
    ("corpus", [{"id": "a", "text": 5}], r"line 1: field 'text' must be str, got int"),
    ("corpus", [{"id": "a", "text": "x"}, "", {"id": "a", "text": "y"}], r"line 3: duplicate passage id"),
    ("corpus", ["[1, 2]"], r"line 1: a row must be a JSON object"),
    ("corpus", ["", "  "], r"is empty"),
    ("corpus", [{"id": None, "text": "x"}], r"line 1: field 'id' must be str or int"),
    ("questions", [{"id": "q", "question": "?", "answers": "Paris"}], r"line 1: field 'answers' must be list"),
    ("questions", [{"id": "q", "question": "?", "answers": []}], r"line 1: field 'answers' must be a non-empty"),
    ("questions", [{"id": "q", "answers": ["a"]}], r"line 1: missing field 'question'"),
    ("questions", [{"id": "q", "question": "?", "answers": ["a"], "hops": 0}], r"line 1: field 'hops'"),
    ("questions", [{"id": "q", "question": "?", "answers": ["a"], "split": "test"}], r"line 1: field 'split'"),
    ("questions", [], r"is empty"),
])
def test_malformed_files_give_one_clear_error(tmp_path, user_files, which, rows, match):
    corpus, questions = user_files
    bad = _write(tmp_path / f"bad_{which}.jsonl", rows)
    files = {"corpus": bad, "questions": questions} if which == "corpus" else {"corpus": corpus, "questions": bad}
    with pytest.raises(ConfigError, match=match) as exc:
        RAGTask(**files)
    assert f"rag {which} file {bad}" in str(exc.value)


def test_a_corpus_without_searchable_words(tmp_path, user_files):
    corpus = _write(tmp_path / "c.jsonl", [{"id": "a", "text": "a"}, {"id": "b", "text": "the of x"}])
    t = RAGTask(corpus=corpus, questions=user_files[1])
    with pytest.raises(ConfigError, match=r"rag corpus file .*c.jsonl has no searchable words"):
        t.make_env()


def test_missing_and_binary_files(tmp_path, user_files, capsys):
    corpus, questions = user_files
    with pytest.raises(ConfigError, match=r"rag corpus file .*nope.jsonl does not exist"):
        RAGTask(corpus=str(tmp_path / "nope.jsonl"), questions=questions)
    with pytest.raises(ConfigError, match=r"is not a file"):
        RAGTask(corpus=corpus, questions=str(tmp_path))
    (tmp_path / "bin.jsonl").write_bytes(b'{"id": "a", "text": "ok"}\n\xff\xfe\n')
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8"):
        RAGTask(corpus=str(tmp_path / "bin.jsonl"), questions=questions)
    assert main(["validate", "rag", "--set", f"corpus={tmp_path / 'nope.jsonl'}", "--set",
                 f"questions={questions}"]) == 2
    assert "nope.jsonl does not exist" in _one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------ through the trainer's rollout
class _OracleEngine:
    """A generation engine that plays the oracle: it reads the question and the searches so far from the
    context and emits the next oracle turn (then the answer with a stated confidence)."""

    def __init__(self, task: RAGTask, tok):
        self.tok = tok
        self.by_prompt = {p.prompt: p for p in task.problems("train") + task.problems("heldout")}

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids, skip_special_tokens=True)
            problem = next(p for prompt, p in self.by_prompt.items() if text.startswith(prompt))
            done = text[len(problem.prompt):].count("<search>")  # the instruction line shows the tag too
            queries = problem.meta["queries"]
            turn = (f"<search>{queries[done]}</search>" if done < len(queries)
                    else f"<answer>{problem.answer}</answer><confidence>0.75</confidence>")
            out.append(self.tok(turn, add_special_tokens=False)["input_ids"])
        return out


def test_rollout_marks_feedback_as_environment_tokens(tmp_path, task):
    pytest.importorskip("transformers")
    import torch

    from reflectrl.llm.policy import load_policy
    from reflectrl.llm.rollout import Rollout
    from reflectrl.llm.tiny import init_tiny

    policy = load_policy(init_tiny(tmp_path / "tiny", layers=1, width=16, heads=2, max_positions=1024))
    problems = [_find(task, "c_founder_city"), _find(task, "p_born", "heldout")]
    ro = Rollout(policy, _OracleEngine(task, policy.tokenizer), task, max_new_tokens=80, max_turns=task.max_turns,
                 max_response_tokens=600, gen_batch=4, reward_workers=2)
    batch, _ = ro.run(problems, 1, torch.Generator().manual_seed(0))
    ro.close()
    tok = policy.tokenizer
    for r, p in enumerate(problems):
        kinds = [k for k, _ in batch.transcripts[r]]
        assert kinds == ["prompt"] + ["policy", "env"] * p.meta["hops"] + ["policy"]
        feedback = [t for k, t in batch.transcripts[r] if k == "env"]
        assert feedback == [f for _, f in task.demonstration_turns(p)[:-1]]
        env_ids = batch.response_ids[r][batch.feedback_mask[r]].tolist()
        assert tok.decode(env_ids) == "".join(feedback)  # exactly the feedback text is masked as env tokens
        policy_text = tok.decode(batch.response_ids[r][batch.completion_mask[r]].tolist())
        assert "</search>" in policy_text and p.answer in policy_text and not any(f in policy_text for f in feedback)
        assert float(batch.scores[r]) == 1.0 and bool(batch.correct[r])
        assert batch.infos[r][-1]["confidence"] == 0.75 and batch.infos[r][-1]["searches"] == p.meta["hops"]


def test_search_credit_pays_each_hop_once_and_leaves_correct_alone():
    t = RAGTask(n_companies=4, search_credit=0.5)
    p = _find(t, "p_employer_city")  # two hops: works, then based
    env = t.make_env(max_turns=6)
    env.reset(p)
    first, second = p.meta["queries"]
    # a search that misses both facts earns nothing; each hop's fact earns 0.5 / 2 the first time only
    rewards = [env.step(f"<search>{q}</search>")[1] for q in ("zzqx", first, first)]
    assert rewards == [0.0, 0.25, 0.0]
    _, r, done, info = env.step(f"<search>{second}</search>")
    assert r == 0.25 and info["found_hops"] == 2 and not done
    # the answer's reward is the outcome alone; wrong, it earns 0 and is not correct
    env2 = t.make_env()
    env2.reset(p)
    env2.step(f"<search>{first}</search>")
    _, r, done, info = env2.step("<answer>nowhere</answer>")
    assert done and r == 0.0 and not info["correct"] and info["found_hops"] == 1
    # the whole oracle episode sums to 1 + search_credit; without the option every search earns 0
    total = sum(step[1] for step in _play(t, p))
    assert total == pytest.approx(1.5)
    assert [step[1] for step in _play(RAGTask(n_companies=4), p)] == [0.0, 0.0, 1.0]
    for bad in (-0.1, 1.5, "x", True):
        with pytest.raises(ConfigError, match="search_credit"):
            RAGTask(n_companies=2, search_credit=bad)


def _play(task: RAGTask, p) -> list[tuple]:
    env = task.make_env()
    env.reset(p)
    return [env.step(turn)[:3] for turn, _ in task.demonstration_turns(p)]


def test_search_credit_on_a_user_collection_counts_a_result_holding_the_answer(user_files):
    corpus, questions = user_files
    t = RAGTask(corpus=corpus, questions=questions, k=1, search_credit=0.4)
    env = t.make_env()
    env.reset(t.problems("heldout")[0])  # answers: Danube
    assert env.step("<search>Eiffel</search>")[1] == 0.0
    assert env.step("<search>Vienna</search>")[1] == pytest.approx(0.4)
    assert env.step("<search>Vienna</search>")[1] == 0.0
