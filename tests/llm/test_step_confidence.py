"""Per-step confidence on rag: the warm-up's stepwise demonstrations (``--step-confidence``) and the evaluation's
per-step ECE and AUROC of the confidences stated along the episodes."""

import math

import pytest
import torch

from reflectrl.errors import ConfigError
from reflectrl.llm.evaluate import _episode_metrics
from reflectrl.llm.warmup import STEP_CONFIDENCES, WarmupConfig, demonstration_rows
from reflectrl.tasks.rag import RAGTask


def _texts(tok, row, kind):
    return [tok.decode(s.ids, skip_special_tokens=True) for s in row.segments if s.kind == kind]


def test_warmup_rows_state_a_confidence_on_every_trained_turn(tiny_policy):
    task = RAGTask(report="steps")
    problems = task.problems("train")[:80]
    rows = demonstration_rows(tiny_policy, task, problems, "off", generator=torch.Generator().manual_seed(0),
                              step_confidence=True, detour_share=0.5)
    tok = tiny_policy.tokenizer
    detours = 0
    for p, row in zip(problems, rows):
        policy, env = _texts(tok, row, "policy"), _texts(tok, row, "env")
        assert len(policy) == p.meta["hops"] + 1  # every oracle search and the answer are trained
        values = [t.split("<confidence>")[1].split("</confidence>")[0] for t in policy]
        assert values[0] in STEP_CONFIDENCES["start"] + STEP_CONFIDENCES["missed"]
        assert all(v in STEP_CONFIDENCES["found"] for v in values[1:])  # the oracle's searches find their fact
        assert policy[-1].startswith("<confidence>") and policy[-1].endswith(f"<answer>{p.answer}</answer>")
        if values[0] in STEP_CONFIDENCES["missed"]:  # a detour: its search is context, before the first policy turn
            detours += 1
            assert env[0].startswith("<confidence>") and "<search>" in env[0]
            assert row.segments[0].kind == "env"
        else:
            assert row.segments[0].kind == "policy"
        assert row.segments[-1].ids[-1] in tiny_policy.eos_ids
    assert 20 <= detours <= 60  # about half of 80, less the problems with no detour query


def test_without_step_confidence_no_search_turn_states_one(tiny_policy):
    task = RAGTask()
    rows = demonstration_rows(tiny_policy, task, task.problems("train")[:30], "off", multi_turn_share=1.0,
                              generator=torch.Generator().manual_seed(0))
    tok = tiny_policy.tokenizer
    assert all("<confidence>" not in t for row in rows for t in _texts(tok, row, "policy"))


def test_detour_share_is_checked():
    with pytest.raises(ConfigError, match="detour_share in \\[0, 1\\]"):
        WarmupConfig(model="m", out="o", detour_share=1.5).validate()


def test_per_step_ece_and_auroc_by_hand():
    """Two episodes: right with stated 0.8 then 0.6, wrong with 0.6 then 0.2; the asked report is left out."""
    episodes = [([{"kind": "search", "confidence": 0.8}, {"kind": "answer", "confidence": 0.6}], True),
                ([{"kind": "search", "confidence": 0.6}, {"kind": "answer", "confidence": 0.2},
                  {"confidence": 0.9, "self_report": "confidence"}], False)]
    m = _episode_metrics(episodes)
    # pairs (q, y): (0.8, 1), (0.6, 1), (0.6, 0), (0.2, 0); AUROC: 0.8 and 0.6 beat 0.2, 0.8 beats 0.6, 0.6 ties 0.6
    assert m["step_auroc"] == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    # 10 bins: [0.2] -> |0.2 - 0|, [0.6, 0.6] -> |0.6 - 0.5|, [0.8] -> |0.8 - 1|, weighted by counts
    assert m["step_ece"] == pytest.approx((0.2 + 2 * 0.1 + 0.2) / 4)
    assert m["step_reports"] == 2.0 and m["tool_calls"] == 1.0
    one = _episode_metrics([([{"kind": "answer", "confidence": 0.7}], True)])
    assert one["step_auroc"] is None and math.isclose(one["step_ece"], 0.3)  # one outcome only: no AUROC
