"""--report-entropy-coef: an entropy bonus on the self-report turn's tokens alone."""

import pytest
import torch

from reflectrl.algos import build, config_for_algo
from reflectrl.contract.base import last_turn_tokens
from reflectrl.errors import ConfigError
from reflectrl.llm.update import REPORT_ENTROPY


def make(tiny_dir, tmp_path, algo="refgrpo", **kw):
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "run"), updates=1, prompts_per_update=3,
                group_size=2, max_new_tokens=9, progress=False, tensorboard=False, save_interval=0)
    base.update(kw)
    return build("llm", algo, config_for_algo(algo, **base))


def test_last_turn_tokens_by_hand():
    turns = torch.tensor([[0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, -1], [0, 1, 1, 1, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1]]).bool()
    asked = torch.tensor([1.0, 1.0, 0.0])
    got = last_turn_tokens(turns, mask, asked)
    want = torch.tensor([[0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]]).bool()
    assert torch.equal(got, want)  # row 0: the masked-out token of turn 2 is not a report token; row 2: not asked


def test_weights_only_the_report_turn_and_changes_the_gradient(tiny_dir, tmp_path):
    t = make(tiny_dir, tmp_path, report_entropy_coef=0.5)
    rec = t.iteration()
    b = t.last_batch
    w = b.extras[REPORT_ENTROPY]
    on = w > 0
    assert on.any() and set(w[on].tolist()) == {0.5}
    assert not (on & ~b.completion_mask).any()  # policy tokens only
    last = torch.where(b.completion_mask, b.turn_ids, -1).max(1).values
    assert (b.turn_ids[on] == last[:, None].expand_as(on)[on]).all()  # of each row's last turn
    assert rec["losses/report_entropy"] > 0

    def grads(batch):
        for p in t.policy.trainable_parameters():
            p.grad = None
        loss, _ = t.micro_loss(batch)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in t.policy.trainable_parameters() if p.grad is not None])

    with_bonus = grads(b)
    b.extras.pop(REPORT_ENTROPY)
    without = grads(b)
    assert not torch.allclose(with_bonus, without)


def test_needs_a_report_turn(tiny_dir, tmp_path):
    with pytest.raises(ConfigError, match="needs a self-report turn"):
        make(tiny_dir, tmp_path, algo="grpo", report_entropy_coef=0.1)
    with pytest.raises(ConfigError, match="--report-entropy-coef must be >= 0"):
        make(tiny_dir, tmp_path, report_entropy_coef=-1.0)
