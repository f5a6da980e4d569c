"""benchmarks/rag_reading.py: the stages of a rag episode on hand-made episodes."""

from types import SimpleNamespace

from .helpers import benchmark_script


def _episode(query, reply, answer, hops=1):
    infos = [{"kind": "search", "query": query}] if query is not None else []
    transcript = [("prompt", "question"), *([("policy", f"<search>{query}</search>"), ("env", reply)] if query else [])]
    infos.append({"kind": "answer", "answered": True, "answer": answer})
    transcript.append(("policy", f"<answer>{answer}</answer>"))
    return infos, transcript


def test_stages_of_hand_made_episodes():
    mod = benchmark_script("rag_reading")
    one_hop = SimpleNamespace(meta={"entity": "Kuka", "hops": 1}, answer="Sikop")
    reply = "\nKuka works at Sikop.\nKuka was born in 1982.\n"
    right = mod.episode_stages(one_hop, *_episode("Kuka works", reply, "Sikop"), True)
    assert right == {"correct": True, "searched": True, "query_names_entity": True, "gold_retrieved": True,
                     "answered": True, "answer_in_context": True}
    miscopied = mod.episode_stages(one_hop, *_episode("Kuku works", "\nFopa works at Tutip.\n", "Dezer"), False)
    assert miscopied["query_names_entity"] is False and miscopied["gold_retrieved"] is False
    assert miscopied["answer_in_context"] is False  # an answer from memory, not from the passages
    misread = mod.episode_stages(one_hop, *_episode("Kuka works", reply, "1982"), False)
    assert misread["gold_retrieved"] is True and misread["answer_in_context"] is True and not misread["correct"]
    two_hop = SimpleNamespace(meta={"entity": "Kuka", "hops": 2}, answer="Rome")
    assert mod.episode_stages(two_hop, *_episode("Kuka works", reply, "Rome"), True)["gold_retrieved"] is None
    blind = mod.episode_stages(one_hop, *_episode(None, "", "Sikop"), True)
    assert blind["searched"] is False and blind["query_names_entity"] is False and blind["gold_retrieved"] is None


def test_shares_and_the_table():
    mod = benchmark_script("rag_reading")
    rows = [{"correct": True, "gold_retrieved": True}, {"correct": False, "gold_retrieved": True},
            {"correct": True, "gold_retrieved": None}]
    assert mod.share(rows, "correct") == (2 / 3, 3)
    assert mod.share(rows, "correct", "gold_retrieved") == (0.5, 2)  # rows where the condition holds
    assert mod.share(rows, "gold_retrieved") == (1.0, 2)  # None: does not apply, left out
    assert mod.share([], "correct") == (None, 0)
