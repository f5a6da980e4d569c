"""The self-report terms a constant cannot win (docs/methods-llm.md; METHODS.md 7b) on hand-worked cases: the
class-balanced agreement bonus and the group rank reward, each with a constant reporter earning exactly the chance
rate, a perfect one, groups that are all right or all wrong, and missing reports; then refgrpo and rlcr using them
through the method contract (episode and split credit) and the option checks."""

import pytest
import torch

from reflectrl.contract.base import MethodRunner, StepBatch, as_nan
from reflectrl.core.advantages import batch_scaled_advantages, group_advantages
from reflectrl.errors import ConfigError
from reflectrl.methods.refgrpo import RefGRPO, RefGRPOOptions
from reflectrl.methods.rewards import balanced_reflection_bonus, group_rank_reward, reflection_bonus
from reflectrl.methods.rlcr import RLCR, RLCROptions
from reflectrl.trainer import check_all

NAN = float("nan")
C = 0.1


def t(values):
    return as_nan(values)


def groups_of(n_rows, size):
    return torch.arange(n_rows) // size


# ------------------------------------------------------------------------------------------ balanced agreement
def test_balanced_bonus_hand_case():
    """p = 1/4: a right answer's agreeing reflection earns c / (2 * 1/4) = 2c, a wrong one's c / (2 * 3/4)."""
    got = balanced_reflection_bonus(t([1, 0, 0, 0]), t([1, 0, 0, 0]), C, groups_of(4, 4))
    torch.testing.assert_close(got, torch.tensor([2 * C, C / 1.5, C / 1.5, C / 1.5]))
    # disagreeing rows earn nothing; the weights are the group's, not the batch's
    got = balanced_reflection_bonus(t([1, 0, 0, 0, 1, 1, 0, 0]), t([0, 0, 1, 0, 1, 0, 0, 1]), C, groups_of(8, 4))
    torch.testing.assert_close(got, torch.tensor([0, C / 1.5, 0, C / 1.5, C, 0, C, 0]))


@pytest.mark.parametrize("outcomes", [[1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 1]])
def test_balanced_bonus_constants_earn_c_over_2_and_a_perfect_reporter_c(outcomes):
    o = t(outcomes)
    g = torch.zeros(len(outcomes), dtype=torch.long)
    for const in (0, 1):
        mean = float(balanced_reflection_bonus(o, torch.full_like(o, float(const)), C, g).mean())
        assert mean == pytest.approx(C / 2)  # whatever the accuracy: the chance rate
    assert float(balanced_reflection_bonus(o, o.clone(), C, g).mean()) == pytest.approx(C)
    # the plain agreement bonus pays the majority constant more than c/2 (what the balanced one removes)
    assert float(reflection_bonus(o, torch.full_like(o, float(o.mean() > 0.5)), C).mean()) > C / 2


def test_balanced_bonus_all_equal_groups_and_missing_reflections():
    g = groups_of(8, 4)
    # group 0 all right, group 1 all wrong: no signal, whatever is said
    got = balanced_reflection_bonus(t([1, 1, 1, 1, 0, 0, 0, 0]), t([1, 1, 0, 1, 0, 0, 1, 0]), C, g)
    torch.testing.assert_close(got, torch.zeros(8))
    # a missing reflection earns 0 but its outcome still counts in p (here 1/2: weights 1 on both classes)
    got = balanced_reflection_bonus(t([1, 0, 1, 0]), t([NAN, 0, 1, NAN]), C, groups_of(4, 4))
    torch.testing.assert_close(got, torch.tensor([0, C, C, 0]))


# ------------------------------------------------------------------------------------------ group rank reward
def test_rank_reward_hand_case():
    """Group 0: a success at 0.9 against failures 0.1, 0.2, 0.9 (2 above, 1 tie: 2.5/3 - 1/2); the failures at 0.1
    and 0.2 are below the success (+1/2), the one at 0.9 ties it (0). Group 1: a missing report earns 0 and is out
    of the pairs; the success at 0.5 is above 0.4 and ties 0.5."""
    got = group_rank_reward(t([1, 0, 0, 0, 1, 1, 0, 0]), t([0.9, 0.1, 0.2, 0.9, NAN, 0.5, 0.5, 0.4]), groups_of(8, 4))
    torch.testing.assert_close(got, torch.tensor([2.5 / 3 - 0.5, 0.5, 0.5, 0.0, 0.0, 0.25, 0.0, 0.5]))


def test_rank_reward_constant_earns_0_and_perfect_earns_half():
    o = t([1, 0, 0, 0, 1, 1, 0, 1])
    g = groups_of(8, 4)
    torch.testing.assert_close(group_rank_reward(o, torch.full_like(o, 0.3), g), torch.zeros(8))
    perfect = torch.where(o > 0, 0.8, 0.1) + 0.01 * torch.arange(8)  # every success above every failure of its group
    torch.testing.assert_close(group_rank_reward(o, perfect, g), torch.full((8,), 0.5))
    # the reverse ranking: -1/2 everywhere; the group's mean is its AUROC - 1/2
    torch.testing.assert_close(group_rank_reward(o, 1 - perfect, g), torch.full((8,), -0.5))


def test_rank_reward_all_equal_groups_missing_and_no_partner():
    g = groups_of(8, 4)
    got = group_rank_reward(t([1, 1, 1, 1, 0, 0, 0, 0]), t([0.9, 0.1, 0.5, 0.3, 0.2, 0.8, 0.4, 0.6]), g)
    torch.testing.assert_close(got, torch.zeros(8))
    # the only failure's report is missing: the successes have no partner (0), the failure earns 0
    got = group_rank_reward(t([1, 1, 0, 1]), t([0.9, 0.1, NAN, 0.5]), groups_of(4, 4))
    torch.testing.assert_close(got, torch.zeros(4))


def test_rank_reward_on_reflections_and_unsorted_group_ids():
    """Binary reflections are reports too; group ids need not be contiguous or sorted."""
    o, r = t([1, 0, 1, 0]), t([1, 0, 0, 0])
    g = torch.tensor([7, 3, 3, 7])  # group 7: rows 0 and 3; group 3: rows 1 and 2
    # group 7: success says 1, failure 0: +1/2 each; group 3: both say 0: ties, 0 each
    torch.testing.assert_close(group_rank_reward(o, r, g), torch.tensor([0.5, 0.0, 0.0, 0.5]))


def test_rank_reward_group_mean_is_auroc_minus_half():
    """Each class's mean share is the group's AUROC (Mann-Whitney), so the group's mean reward is AUROC - 1/2."""
    from reflectrl.eval.calibration import auroc

    gen = torch.Generator().manual_seed(0)
    o = (torch.rand(16, generator=gen) < 0.4).float()
    o[0], o[1] = 1.0, 0.0
    q = torch.round(torch.rand(16, generator=gen) * 4) / 4  # ties included
    reward = group_rank_reward(o, q, torch.zeros(16, dtype=torch.long))
    area = auroc(q.tolist(), o.tolist())
    assert 0.5 < area < 1 or 0 < area < 0.5  # not a degenerate case
    for cls in (o > 0, o == 0):
        assert float(reward[cls].mean()) == pytest.approx(area - 0.5, abs=1e-6)
    assert float(reward.mean()) == pytest.approx(area - 0.5, abs=1e-6)


# ------------------------------------------------------------------------------------------ through the methods
def _batch(outcome, group_size, steps=4, **reports):
    """Two-turn rows of 4 tokens: the answer (turn 0, tokens 0-1) and the self-report (turn 1, tokens 2-3)."""
    R = len(outcome)
    end = torch.zeros(R, steps, dtype=torch.bool)
    end[:, -1] = True
    z = torch.zeros(R, steps)
    info = {"outcome": t(outcome), "correct": t(outcome), "report_asked": torch.ones(R)}
    info.update({k: t(v) for k, v in reports.items()})
    adv = group_advantages(t(outcome), groups_of(R, group_size))[:, None].expand(-1, steps).clone()
    return StepBatch(states=torch.zeros(R, steps, 2), features=torch.zeros(R, steps, 2), rewards=z, values=z,
                     advantages=adv, returns=z, episode_end=end, terminated=end, next_values=z,
                     mask=torch.ones(R, steps), group_size=group_size, turn_ids=torch.tensor([[0, 0, 1, 1]] * R),
                     info=info)


OUT = [1, 0, 0, 0, 1, 1, 0, 1]
REFL = [1, 0, 1, 0, 1, 1, 1, 0]


@pytest.mark.parametrize("kind", ["balanced", "rank"])
def test_refgrpo_new_bonuses_under_episode_and_split_credit(kind):
    g = groups_of(8, 4)
    want = (balanced_reflection_bonus(t(OUT), t(REFL), C, g) if kind == "balanced"
            else C * group_rank_reward(t(OUT), t(REFL), g))
    assert float(want.abs().sum()) > 0 and not torch.equal(want, reflection_bonus(t(OUT), t(REFL), C))
    m = RefGRPO(RefGRPOOptions(refgrpo_reward=kind))
    sh = MethodRunner(m).run(_batch(OUT, 4, reflection=REFL))
    torch.testing.assert_close(sh.reward_delta[:, -1], want)  # at the last token, before normalization
    assert float(sh.reward_delta[:, :-1].abs().sum()) == 0.0
    assert m.metrics()["refgrpo/bonus_mean"] == pytest.approx(float(want.mean()))
    b = _batch(OUT, 4, reflection=REFL)
    sh = MethodRunner(RefGRPO(RefGRPOOptions(refgrpo_reward=kind, refgrpo_credit="split"))).run(b)
    adv = b.advantages + sh.advantage_delta
    torch.testing.assert_close(adv[:, :2], b.advantages[:, :2])  # the answer keeps the outcome's advantage
    torch.testing.assert_close(adv[:, 2:], group_advantages(want, g)[:, None].expand(-1, 2))


def test_refgrpo_default_is_the_agreement_bonus():
    assert RefGRPOOptions().refgrpo_reward == "agreement"
    sh = MethodRunner(RefGRPO(RefGRPOOptions())).run(_batch(OUT, 4, reflection=REFL))
    torch.testing.assert_close(sh.reward_delta[:, -1], reflection_bonus(t(OUT), t(REFL), C))


def test_rlcr_rank_calibration_goes_on_the_confidence_turn():
    q = [0.9, 0.2, None, 0.4, 0.6, 0.6, 0.5, 0.7]  # row 2 missing: the format penalty, and out of the pairs
    b = _batch(OUT, 4, confidence=q)
    m = RLCR(RLCROptions(rlcr_credit="split", rlcr_calibration="rank"))
    sh = MethodRunner(m).run(b)
    g = groups_of(8, 4)
    rank = group_rank_reward(t(OUT), t(q), g)
    # group 0: success 0.9 above both valid failures (+1/2); failures 0.2, 0.4 below it (+1/2); row 2 missing
    torch.testing.assert_close(rank[:4], torch.tensor([0.5, 0.5, 0.0, 0.5]))
    term = torch.where(torch.isnan(t(q)), torch.tensor(-2.0), rank)
    adv = b.advantages + sh.advantage_delta
    torch.testing.assert_close(adv[:, :2], b.advantages[:, :2])
    torch.testing.assert_close(adv[:, 2:], group_advantages(term, g)[:, None].expand(-1, 2))
    assert m.metrics()["rlcr/rank_mean"] == pytest.approx(float(rank[~torch.isnan(t(q))].mean()))
    # the default (brier) is unchanged: the calibration term is -(q - y)^2
    b = _batch(OUT, 4, confidence=q)
    sh = MethodRunner(RLCR(RLCROptions(rlcr_credit="split"))).run(b)
    brier = torch.where(torch.isnan(t(q)), torch.tensor(-2.0), -(t(q).nan_to_num(0) - t(OUT)) ** 2)
    torch.testing.assert_close((b.advantages + sh.advantage_delta)[:, 2:],
                               group_advantages(brier, g)[:, None].expand(-1, 2))


@pytest.mark.parametrize("kind", ["brier", "batch-rank"])
def test_rlcr_report_weight_scales_the_confidence_turn_alone(kind):
    """--rlcr-report-weight w: the confidence turn's advantage is w times the unweighted one; the answer's tokens keep
    the outcome's advantage; w = 1 is the unweighted shaping exactly."""
    q = [0.9, 0.2, None, 0.4, 0.6, 0.6, 0.5, 0.7]
    opts = {"rlcr_credit": "split", "rlcr_calibration": kind}
    b = _batch(OUT, 4, confidence=q)
    base = b.advantages + MethodRunner(RLCR(RLCROptions(**opts))).run(b).advantage_delta
    b = _batch(OUT, 4, confidence=q)
    same = b.advantages + MethodRunner(RLCR(RLCROptions(**opts, rlcr_report_weight=1.0))).run(b).advantage_delta
    assert torch.equal(same, base)
    b = _batch(OUT, 4, confidence=q)
    got = b.advantages + MethodRunner(RLCR(RLCROptions(**opts, rlcr_report_weight=0.25))).run(b).advantage_delta
    torch.testing.assert_close(got[:, :2], b.advantages[:, :2])
    torch.testing.assert_close(got[:, 2:], 0.25 * base[:, 2:])
    assert base[:, 2:].abs().sum() > 0


def test_rlcr_report_weight_needs_split_credit_and_no_sign_flip():
    with pytest.raises(ConfigError, match="--rlcr-report-weight takes --rlcr-credit split"):
        check_all(RLCROptions(rlcr_report_weight=0.5).validate_rlcr())
    with pytest.raises(ConfigError, match="--rlcr-report-weight must be >= 0"):
        check_all(RLCROptions(rlcr_credit="split", rlcr_report_weight=-1.0).validate_rlcr())
    check_all(RLCROptions(rlcr_credit="split", rlcr_report_weight=0.5).validate_rlcr())


def test_rlcr_rank_needs_split_credit():
    assert RLCROptions().rlcr_calibration == "brier"
    with pytest.raises(ConfigError, match="--rlcr-calibration rank takes --rlcr-credit split"):
        check_all(RLCROptions(rlcr_calibration="rank").validate_rlcr())
    check_all(RLCROptions(rlcr_calibration="rank", rlcr_credit="split").validate_rlcr())


def test_balanced_rank_reward_hand_case():
    """One success at 0.9 against failures at 0.5, 0.95 and 0.1: unweighted, the success earns 2/3 - 1/2 = 1/6 and
    the failures +1/2, -1/2, +1/2. Balanced, the success is weighted (1 + 3) / (2 * 1) = 2 and each failure
    (1 + 3) / (2 * 3) = 2/3: 1/3, 1/3, -1/3, 1/3; the group's mean is still its AUROC (2/3) minus 1/2."""
    o, q, g = t([1, 0, 0, 0]), t([0.9, 0.5, 0.95, 0.1]), groups_of(4, 4)
    torch.testing.assert_close(group_rank_reward(o, q, g), t([1 / 6, 0.5, -0.5, 0.5]))
    got = group_rank_reward(o, q, g, balanced=True)
    torch.testing.assert_close(got, t([1 / 3, 1 / 3, -1 / 3, 1 / 3]))
    assert float(got.mean()) == pytest.approx(2 / 3 - 0.5)


def test_balanced_rank_reward_gives_each_outcome_the_same_total_weight():
    """A group of one success and three failures, every report tied at 0.5. Moving one row's report up alone by a
    little: the success goes from tying every failure to beating them (+1/2), a failure from tying the success to
    being below it (-1/2 each). Summed over the rows, the pull on a shared level is 1/2 - 3/2 = -1 unweighted: the
    failures win three to one. Balanced (weights 2 and 2/3) it is 1 - 1 = 0. A constant still earns 0, an
    all-equal group 0; a missing report counts in neither class."""
    o, g = t([1, 0, 0, 0]), groups_of(4, 4)
    base = torch.full((4,), 0.5)
    for balanced, want in ((False, -1.0), (True, 0.0)):
        pull = [float(group_rank_reward(o, base + 0.01 * (torch.arange(4) == i), g, balanced)[i]
                      - group_rank_reward(o, base, g, balanced)[i]) for i in range(4)]
        assert pull[0] > 0 and all(p < 0 for p in pull[1:])
        assert sum(pull) == pytest.approx(want, abs=1e-6)
    torch.testing.assert_close(group_rank_reward(o, base, g, balanced=True), torch.zeros(4))
    torch.testing.assert_close(group_rank_reward(t([1, 1, 1, 1]), t([0.1, 0.5, 0.3, 0.7]), g, balanced=True),
                               torch.zeros(4))
    # with the second failure's report missing, the counts are 1 and 2: weights 3/2 and 3/4
    got = group_rank_reward(o, t([0.9, 0.5, NAN, 0.1]), g, balanced=True)
    torch.testing.assert_close(got, t([1.5 * 0.5, 0.75 * 0.5, 0.0, 0.75 * 0.5]))


def test_batch_scaled_advantages_hand_case():
    """Centred in each group, divided by one std over the rows of the groups that hold a nonzero centred value:
    group 1 (all equal) gets 0 and stays out of the std."""
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    r = t([1, 0, 0, 0, 0, 0, 0, 0, 0.5, 0.5, -0.5, 0.5])
    centred = t([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])
    want = torch.cat([centred[:4], torch.zeros(4), centred[4:]]) / centred.std()
    torch.testing.assert_close(batch_scaled_advantages(r, g), want)
    torch.testing.assert_close(batch_scaled_advantages(torch.ones(4), groups_of(4, 4)), torch.zeros(4))


def _level_drift(probs: torch.Tensor, accuracy: float, balanced: bool, scale: str, seed: int = 0,
                 one_pool: bool = False) -> float:
    """The change of the mean stated level after one unit step of the expected policy gradient, for a reporter whose
    confidence (0.0-0.9) does not depend on its episode, in groups of 8 at this accuracy; the report turn's
    advantage scaled by each group's std (GRPO) or by one std over the batch."""
    torch.manual_seed(seed)
    levels = torch.arange(10) / 10
    logits = torch.log(probs).requires_grad_(True)
    G, n = 4000, 8
    idx = torch.distributions.Categorical(logits=logits.detach()).sample((G * n,))
    correct = (torch.rand(G * n) < accuracy).float()
    groups = torch.zeros(G * n, dtype=torch.long) if one_pool else torch.arange(G * n) // n
    term = group_rank_reward(correct, levels[idx], groups, balanced=balanced)
    adv = batch_scaled_advantages(term, groups) if scale == "batch" else group_advantages(term, groups)
    (grad,) = torch.autograd.grad((adv * torch.log_softmax(logits, 0)[idx]).mean(), logits)
    before, after = torch.softmax(logits.detach(), 0), torch.softmax(logits.detach() + grad, 0)
    return float((after * levels).sum() - (before * levels).sum())


@pytest.mark.parametrize("probs", [torch.full((10,), 0.1), t([.3, .2, .15, .1, .08, .07, .04, .03, .02, .01])])
def test_rank_reward_moves_an_uninformed_level_down_and_the_balanced_form_does_not(probs):
    """The cause of rlcr-rank's sinking confidence, reproduced: at 15% accuracy the plain rank term under GRPO's
    per-group std moves an uninformed reporter's level down (about 0.01 per unit step); the balanced weights under
    the per-group std still do, by about a seventh of that; the balanced weights with one std over the batch leave the
    level where it is, within the Monte Carlo noise of 32000 rows."""
    assert _level_drift(probs, 0.15, balanced=False, scale="group") < -5e-3
    assert -5e-3 < _level_drift(probs, 0.15, balanced=True, scale="group") < -8e-4
    assert abs(_level_drift(probs, 0.15, balanced=True, scale="batch")) < 5e-4
    assert abs(_level_drift(probs, 0.15, balanced=True, scale="batch", one_pool=True)) < 5e-4  # batch-rank


def test_batch_rank_pairs_across_questions():
    """batch-rank is rank-balanced with the batch as one pool: group 0 (one success at 0.9, one failure at 0.2) and
    group 1 (two failures at 0.5 and 0.95). In its group the success earns +1/2 (weight 1); in the batch it beats
    two of three failures (2/3 - 1/2, weight 4/2 = 2: 1/3), and the failure at 0.95, of another question, is above
    it (-1/2, weight 4/6: -1/3). A report that is high on the easy question and low on the hard one earns too."""
    from reflectrl.methods.refgrpo import rank_pools, rank_reward

    batch = _batch([1, 0, 0, 0], group_size=2)
    o, q = t([1, 0, 0, 0]), t([0.9, 0.2, 0.5, 0.95])
    assert rank_pools("batch-rank", batch).tolist() == [0, 0, 0, 0]
    torch.testing.assert_close(rank_reward("rank-balanced", o, q, batch), t([0.5, 0.5, 0.0, 0.0]))
    torch.testing.assert_close(rank_reward("batch-rank", o, q, batch), t([1 / 3, 1 / 3, 1 / 3, -1 / 3]))
    # easy question all right, hard one all wrong: no group holds a pair, the batch does
    o2, q2 = t([1, 1, 0, 0]), t([0.8, 0.7, 0.2, 0.1])
    torch.testing.assert_close(rank_reward("rank-balanced", o2, q2, batch), torch.zeros(4))
    torch.testing.assert_close(rank_reward("batch-rank", o2, q2, batch), torch.full((4,), 0.5))


@pytest.mark.parametrize("balanced", [False, True])
def test_rank_reward_equals_the_pairwise_definition(balanced):
    """Random groups (unsorted ids, ties, missing reports) against the definition written pair by pair."""
    gen = torch.Generator().manual_seed(3)
    R = 60
    groups = torch.randint(0, 7, (R,), generator=gen) * 5 - 9
    correct = (torch.rand(R, generator=gen) < 0.4).float()
    report = torch.round(torch.rand(R, generator=gen) * 5) / 5
    report[torch.rand(R, generator=gen) < 0.15] = NAN
    want = torch.zeros(R)
    for i in range(R):
        if torch.isnan(report[i]):
            continue
        mates = [j for j in range(R) if groups[j] == groups[i] and not torch.isnan(report[j])]
        other = [j for j in mates if correct[j] != correct[i]]
        if not other:
            continue
        sign = 1.0 if correct[i] > 0 else -1.0  # a success beats lower reports, a failure is beaten by higher ones
        share = sum(1.0 if sign * (report[i] - report[j]) > 0 else 0.5 if report[i] == report[j] else 0.0
                    for j in other) / len(other) - 0.5
        own = len(mates) - len(other)
        want[i] = share * (len(mates) / (2 * own) if balanced else 1.0)
    torch.testing.assert_close(group_rank_reward(correct, report, groups, balanced), want)
