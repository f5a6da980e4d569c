"""The token batch layout: masks of prompt, completion and feedback tokens, and the loss on them."""

import pytest
import torch

from reflectrl.algos import config_for_algo
from reflectrl.llm.batch import RowResult, Segment, TokenBatch, build_batch
from reflectrl.llm.grpo import GRPO
from reflectrl.llm.policy import TokenOutputs

PAD = 0


def hand_batch() -> TokenBatch:
    """Row 0: prompt [5, 6], turn 0 [7, 8], feedback [9], turn 1 [10] (reward 1 at its end).
    Row 1: prompt [5], turn 0 [7] (reward 0). Both rows in group 3."""
    rows = [RowResult([5, 6], [Segment([7, 8], "policy", 0, 0.0), Segment([9], "env", 0),
                               Segment([10], "policy", 1, 1.0)], None, 1.0, True, False, []),
            RowResult([5], [Segment([7], "policy", 0, 0.0)], None, 0.0, False, False, [])]
    return build_batch(rows, [3, 3], [], PAD)


def test_layout_and_masks():
    b = hand_batch()
    assert b.prompt_ids.tolist() == [[5, 6], [PAD, 5]]
    assert b.prompt_mask.tolist() == [[True, True], [False, True]]
    assert b.response_ids.tolist() == [[7, 8, 9, 10], [7, PAD, PAD, PAD]]
    assert b.completion_mask.int().tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]
    assert b.feedback_mask.int().tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert b.turn_ids.tolist() == [[0, 0, 0, 1], [0, -1, -1, -1]]
    assert b.token_rewards.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [PAD, 5, 7, PAD, PAD, PAD]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 1, 1]]
    full = b.full_masks()
    assert full["prompt"].int().tolist() == [[1, 1, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0]]
    assert full["completion"].int().tolist() == [[0, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 0]]
    assert full["feedback"].int().tolist() == [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert (full["prompt"] & full["completion"]).sum() == 0 and (full["completion"] & full["feedback"]).sum() == 0
    assert b.last_completion_index().tolist() == [3, 0]


def test_row_operations_round_trip():
    b = hand_batch()
    one = b.select([1])
    assert one.prompt_ids.tolist() == [[5]] and one.response_ids.tolist() == [[7]]
    both = TokenBatch.cat([b.select([1]), b.select([0])], PAD)
    assert both.response_ids.tolist() == [[7, PAD, PAD, PAD], [7, 8, 9, 10]]
    assert both.prompt_ids.tolist() == [[PAD, 5], [5, 6]] and both.index.tolist() == [3, 3]
    back = TokenBatch.from_records(b.to_records(), pad_id=PAD)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "completion_mask", "feedback_mask", "turn_ids",
                 "token_rewards", "index", "scores", "correct"):
        assert torch.equal(getattr(back, name), getattr(b, name)), name
    teacher = b.with_prompts([[1, 2, 3, 5, 6], [4, 5]], PAD)
    assert teacher.prompt_ids.shape == (2, 5) and torch.equal(teacher.response_ids, b.response_ids)
    assert teacher.position_ids[0, -1] == 8  # 5 prompt tokens + 4 response tokens


class FixedLogp:
    """Stands in for the policy's forward: the log-probs are a leaf tensor whose gradient we read."""

    def __init__(self, logp):
        self.logp = logp

    def __call__(self, batch, **kw):
        return TokenOutputs(self.logp[:batch.rows, :batch.steps], entropy=torch.zeros_like(self.logp))


@pytest.mark.parametrize("mode,loss,g0,g1", [
    ("token-mean", -0.5, -1 / 4, 1 / 4),
    ("seq-mean-token-mean", 0.0, -1 / 6, 1 / 2),
    ("seq-mean-token-sum-norm", -0.25, -1 / 8, 1 / 8),
])
def test_loss_on_hand_worked_batch(tiny_dir, mode, loss, g0, g1):
    """Advantages +1 (row 0) and -1 (row 1), ratio 1: the loss and its gradient per token by hand;
    prompt, feedback and padding tokens get no gradient."""
    cfg = config_for_algo("grpo", task="toy-add", model=str(tiny_dir), loss_agg_mode=mode, norm_len=4,
                          prompts_per_update=1, group_size=2, progress=False)
    trainer = GRPO(cfg)
    b = hand_batch()
    b.advantages = torch.tensor([[1.0] * 4, [-1.0] * 4]) * b.completion_mask
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    b.old_logp = logp.detach().clone()
    trainer.policy.forward_batch = FixedLogp(logp)
    out, stats = trainer.micro_loss(b)
    assert out.item() == pytest.approx(loss)
    out.backward()
    assert torch.allclose(logp.grad, torch.tensor([[g0, g0, 0.0, g0], [g1, 0.0, 0.0, 0.0]]))
    assert float(stats["losses/clipfrac"]) == 0.0


def test_trimmed_select_and_cat_follow_the_field_registry():
    """Per-token fields are cut and padded with the responses; per-row ones are not, even when their width happens
    to equal the response width; an unregistered key is refused with the way to register it."""
    from reflectrl.contract.fields import register_field
    from reflectrl.methods.exgrpo import OFFPOLICY

    tok = register_field("test_weight", "token", "trainer", "a test's per-token weight")
    row = register_field("test_score", "row", "method", "a test's per-row score, as wide as the responses")
    b = hand_batch()
    C = b.steps
    b.extras.update({OFFPOLICY: torch.ones(2, C), tok: torch.ones(2, C), row: torch.ones(2, C),
                     "row_id": torch.arange(2)})
    one = b.select([1])  # row 1 has one response token: every per-token entry is cut to it
    assert one.steps == 1
    assert all(one.extras[k].shape == (1, 1) for k in (OFFPOLICY, tok))
    assert one.extras[row].shape == (1, C) and one.extras["row_id"].tolist() == [1]
    both = TokenBatch.cat([one, b.select([0])], PAD)
    assert both.extras[OFFPOLICY].shape == (2, C) and both.extras[OFFPOLICY][0, 1:].sum() == 0
    assert both.extras[row].shape == (2, C)
    b.extras["unregistered"] = torch.ones(2, C)
    with pytest.raises(KeyError, match="register_field"):
        b.select([1])


def test_a_field_is_registered_once_with_one_shape_and_reader():
    from reflectrl.contract.fields import FIELDS, read_by, register_field

    key = register_field("test_once", "token", "loss", "a test's loss input")
    assert register_field("test_once", "token", "loss", "said again") == key and FIELDS[key].doc == "a test's loss input"
    with pytest.raises(ValueError, match="already registered as a token field for the loss"):
        register_field("test_once", "row", "loss", "another shape")
    with pytest.raises(ValueError, match="per must be token or row"):
        register_field("test_bad", "column", "loss", "")  # type: ignore[arg-type]
    extras = {key: torch.ones(1, 2), "row_id": torch.zeros(1)}
    assert list(read_by(extras, "loss")) == [key] and list(read_by(extras, "trainer")) == ["row_id"]
