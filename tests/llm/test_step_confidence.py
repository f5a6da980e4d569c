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
    """Every trained turn opens with a confidence of its level; a detour's search is context (an env segment) and
    the trained turn after it states a low one; both kinds of detour, at either hop, appear."""
    task = RAGTask(report="steps")
    problems = task.problems("train")[:120]
    rows = demonstration_rows(tiny_policy, task, problems, "off", generator=torch.Generator().manual_seed(0),
                              step_confidence=True, detour_share=0.5)
    tok = tiny_policy.tokenizer
    level = {v: k for k, vs in STEP_CONFIDENCES.items() for v in vs}
    seen = set()
    for p, row in zip(problems, rows):
        policy = _texts(tok, row, "policy")
        assert len(policy) == p.meta["hops"] + 1  # every oracle search and the answer are trained
        levels = [level[t.split("<confidence>")[1].split("</confidence>")[0]] for t in policy]
        assert policy[-1].startswith("<confidence>") and policy[-1].endswith(f"<answer>{p.answer}</answer>")
        searches = [tok.decode(s.ids, skip_special_tokens=True) for s in row.segments if s.kind == "env"
                    and "<search>" in tok.decode(s.ids, skip_special_tokens=True)]
        if not searches:
            assert levels == ["start"] + ["found"] * p.meta["hops"]
            continue
        (miss,) = searches  # one detour: the turn after it states "missed", every other is the oracle's
        hop = levels.index("missed")
        assert levels[:hop] == ["start", "found"][:hop] and levels[hop + 1:] == ["found"] * (len(levels) - hop - 1)
        query = miss.split("<search>")[1].split("</search>")[0]
        seen.add(("relation" if query.split(" ")[1] != p.meta["relations"][hop] else "typo", hop))
        assert row.segments[-1].ids[-1] in tiny_policy.eos_ids
    assert {("relation", 0), ("typo", 0), ("relation", 1), ("typo", 1)} <= seen


def test_without_step_confidence_no_search_turn_states_one(tiny_policy):
    task = RAGTask()
    rows = demonstration_rows(tiny_policy, task, task.problems("train")[:30], "off", multi_turn_share=1.0,
                              generator=torch.Generator().manual_seed(0))
    tok = tiny_policy.tokenizer
    assert all("<confidence>" not in t for row in rows for t in _texts(tok, row, "policy"))


def test_detour_share_is_checked():
    with pytest.raises(ConfigError, match="--detour-share in \\[0, 1\\]"):
        WarmupConfig(model="m", out="o", detour_share=1.5).validate()


def test_per_step_ece_and_auroc_by_hand():
    """Two episodes: right with stated 0.8 then 0.6, wrong with 0.6 then 0.2; the asked report is left out."""
    episodes = [([{"kind": "search", "confidence": 0.8}, {"kind": "answer", "confidence": 0.6}], True),
                ([{"kind": "search", "confidence": 0.6}, {"kind": "answer", "confidence": 0.2},
                  {"confidence": 0.9, "self_report": "confidence"}], False)]
    m = _episode_metrics(episodes, ("search",))  # rag's tool kind
    # pairs (q, y): (0.8, 1), (0.6, 1), (0.6, 0), (0.2, 0); AUROC: 0.8 and 0.6 beat 0.2, 0.8 beats 0.6, 0.6 ties 0.6
    assert m["step_auroc"] == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    # 10 bins: [0.2] -> |0.2 - 0|, [0.6, 0.6] -> |0.6 - 0.5|, [0.8] -> |0.8 - 1|, weighted by counts
    assert m["step_ece"] == pytest.approx((0.2 + 2 * 0.1 + 0.2) / 4)
    assert m["step_reports"] == 2.0 and m["tool_calls"] == 1.0
    one = _episode_metrics([([{"kind": "answer", "confidence": 0.7}], True)], ("search",))
    assert one["step_auroc"] is None and math.isclose(one["step_ece"], 0.3)  # one outcome only: no AUROC


def test_step_brier_by_hand():
    """Mean over a row's agent turns of (q_t - y)^2; the asked report is left out; a turn without a confidence
    makes the row NaN."""
    from reflectrl.llm.episodes import step_brier
    from reflectrl.tasks.selfreport import turn_confidences

    infos = [[{"kind": "search", "confidence": 0.5}, {"kind": "answer", "confidence": 0.9}],  # right
             [{"kind": "search", "confidence": 0.5}, {"kind": "answer", "confidence": 0.9},
              {"confidence": 0.0, "self_report": "confidence"}],  # wrong; the asked 0.0 is not a step
             [{"kind": "search"}, {"kind": "answer", "confidence": 0.2}]]  # a turn without one
    got = step_brier([turn_confidences(rows) for rows in infos], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(got[:2], torch.tensor([(0.25 + 0.01) / 2, (0.25 + 0.81) / 2]))
    assert math.isnan(float(got[2]))


def _rlcr_shaped(opts, info: dict) -> tuple[torch.Tensor, dict]:
    """rlcr's reward change at the last step of three 4-step rows with episode ``info``, and its metrics."""
    from reflectrl.contract.base import MethodRunner, StepBatch
    from reflectrl.methods.rlcr import RLCR

    R, T = 3, 4
    end = torch.zeros(R, T, dtype=torch.bool)
    end[:, -1] = True
    z = torch.zeros(R, T)
    b = StepBatch(states=torch.zeros(R, T, 2), features=torch.zeros(R, T, 2), rewards=z, values=z, advantages=z,
                  returns=z, episode_end=end, terminated=end, next_values=z, mask=torch.ones(R, T), info=info)
    m = RLCR(opts)
    return MethodRunner(m).run(b).reward_delta[:, -1], m.metrics()


def test_rlcr_steps_rewards_the_mean_step_brier(tiny_dir):
    from reflectrl.methods.rewards import RLCR_FORMAT_PENALTY
    from reflectrl.methods.rlcr import RLCROptions

    correct = torch.tensor([1.0, 0.0, 1.0])
    info = {"outcome": correct, "correct": correct, "confidence": torch.tensor([0.9, 0.9, 0.9]),
            "step_brier": torch.tensor([0.13, 0.53, float("nan")])}
    delta, met = _rlcr_shaped(RLCROptions(rlcr_confidence="steps"), info)
    # reward = 1[correct] - mean step Brier (the final confidence alone is not what is scored); NaN: the penalty
    torch.testing.assert_close(delta, torch.tensor([-0.13, -0.53, RLCR_FORMAT_PENALTY - 1.0]))
    assert met["rlcr/brier"] == pytest.approx(0.33) and met["rlcr/missing_rate"] == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="rlcr-confidence steps"):
        from reflectrl.algos import get_algo

        a = get_algo("llm", "rlcr")
        a.config(task="rag", model=str(tiny_dir), self_report="confidence", rlcr_confidence="steps",
                 rlcr_credit="split").validate()


def test_rlcr_no_answer_penalty():
    """--rlcr-no-answer penalty: an episode that ended without an answer gets the format penalty whatever its stated
    confidences; score (the default) scores it as a wrong answer; a batch without the info is left as it was."""
    from reflectrl.methods.rewards import RLCR_FORMAT_PENALTY
    from reflectrl.methods.rlcr import RLCROptions

    correct = torch.tensor([1.0, 0.0, 0.0])
    info = {"outcome": correct, "correct": correct, "step_brier": torch.tensor([0.01, 0.25, 0.01]),
            "answered": torch.tensor([1.0, 1.0, 0.0])}  # row 2: turns used up, low confidences throughout
    delta, met = _rlcr_shaped(RLCROptions(rlcr_confidence="steps", rlcr_no_answer="penalty"), info)
    torch.testing.assert_close(delta, torch.tensor([-0.01, -0.25, RLCR_FORMAT_PENALTY]))
    assert met["rlcr/unanswered_rate"] == pytest.approx(1 / 3)
    delta, met = _rlcr_shaped(RLCROptions(rlcr_confidence="steps"), info)
    torch.testing.assert_close(delta, torch.tensor([-0.01, -0.25, -0.01]))  # never answering costs about nothing
    assert "rlcr/unanswered_rate" not in met
    no_info = {k: v for k, v in info.items() if k != "answered"}
    delta, _ = _rlcr_shaped(RLCROptions(rlcr_confidence="steps", rlcr_no_answer="penalty"), no_info)
    torch.testing.assert_close(delta, torch.tensor([-0.01, -0.25, -0.01]))
    # the final form too: the asked confidence of an unanswered episode does not save it
    final = {"outcome": correct, "correct": correct, "confidence": torch.tensor([0.9, 0.1, 0.1]),
             "answered": torch.tensor([1.0, 1.0, 0.0])}
    delta, _ = _rlcr_shaped(RLCROptions(rlcr_no_answer="penalty"), final)
    torch.testing.assert_close(delta, torch.tensor([-0.01, -0.01, RLCR_FORMAT_PENALTY]))


def test_episode_info_answered():
    """``answered`` is 1 where some turn's info says the episode answered; absent on tasks whose infos never say."""
    from types import SimpleNamespace

    from reflectrl.llm.episodes import episode_info

    infos = [[{"kind": "search"}, {"kind": "answer", "answered": True, "outcome": 1.0}],
             [{"kind": "search"}, {"kind": "search", "answered": False, "truncated": True, "outcome": 0.0}],
             [{"kind": "answer", "answered": True, "outcome": 0.0}, {"self_report": "confidence", "confidence": 0.3}]]
    b = SimpleNamespace(infos=infos, rows=3, scores=torch.tensor([1.0, 0.0, 0.0]),
                        correct=torch.tensor([True, False, False]))
    torch.testing.assert_close(episode_info(b)["answered"], torch.tensor([1.0, 0.0, 1.0]))
    b.infos = [[{"outcome": 1.0}], [{"outcome": 0.0}], [{"outcome": 0.0}]]
    assert "answered" not in episode_info(b)


class _StepwiseEngine:
    """A rag agent by script: a first turn that states 0.5 and searches the oracle query, then an answer that states
    0.9; right for the even problems of the train split, wrong for the odd ones, and no confidence on the answer of
    every third."""

    def __init__(self, policy, task):
        self.tok = policy.tokenizer
        self.problems = {p.prompt: (i, p) for i, p in enumerate(task.problems("train"))}

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids, skip_special_tokens=True)
            prompt = next(k for k in self.problems if text.startswith(k))
            i, p = self.problems[prompt]
            if text == prompt:
                reply = f"<confidence>0.5</confidence><search>{p.meta['queries'][0]}</search>"
            else:
                tag = "" if i % 3 == 2 else "<confidence>0.9</confidence>"
                reply = f"{tag}<answer>{p.answer if i % 2 == 0 else 'nowhere'}</answer>"
            out.append(self.tok(reply, add_special_tokens=False)["input_ids"])
        return out

    def sync(self, policy):
        """Scripted: nothing to follow."""


def test_rlcr_steps_through_the_trainer_on_rag(tmp_path):
    """The stated confidences reach the reward: each row's shaped reward is 1[correct] minus the mean Brier term of
    its two turns' confidences, or the format penalty where the answer states none."""
    from reflectrl.algos import get_algo
    from reflectrl.llm.engines import ENGINES, register_engine
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.methods.rewards import RLCR_FORMAT_PENALTY

    opts = ("report=steps", "instructions=False", "n_companies=4")
    task = RAGTask(report="steps", instructions=False, n_companies=4)
    register_engine("scripted-steps", lambda policy, temperature=1.0, top_k=0, **kw: _StepwiseEngine(policy, task))
    try:
        model = init_tiny(tmp_path / "tiny", layers=1, width=32, heads=2, max_positions=512, seed=0)
        a = get_algo("llm", "rlcr")
        t = a.make(a.config(task="rag", task_options=opts, model=str(model), run_dir=str(tmp_path / "r"), updates=1,
                            prompts_per_update=6, group_size=2, progress=False, tensorboard=False, reward_workers=0,
                            self_report="inline", rlcr_confidence="steps", engine="scripted-steps"))
        t.learn()
    finally:
        ENGINES.pop("scripted-steps", None)
    b = t.last_batch
    seen = set()
    for r in range(b.rows):
        infos = b.infos[r]
        assert [i["kind"] for i in infos] == ["search", "answer"] and infos[0]["confidence"] == 0.5
        y, q = float(infos[-1]["correct"]), infos[-1].get("confidence")
        want = RLCR_FORMAT_PENALTY if q is None else y - ((0.5 - y) ** 2 + (q - y) ** 2) / 2
        assert float(b.token_rewards[r][b.completion_mask[r]].sum()) == pytest.approx(want)
        seen.add((y, q))
    assert {(1.0, 0.9), (0.0, 0.9)} <= seen and any(q is None for _, q in seen)
