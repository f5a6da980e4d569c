"""The self-report terms a constant cannot win in runs: each new flag trains through the CLI on the tiny model, a
scripted run gives the report turn's tokens the group advantage of the new term computed from the batch itself,
and a bad combination is one error line."""

import re

import pytest
import torch

from reflectrl.algos import get_algo
from reflectrl.cli import main
from reflectrl.contract.base import as_nan
from reflectrl.core.advantages import batch_scaled_advantages, group_advantages
from reflectrl.methods.rewards import balanced_reflection_bonus, group_rank_reward
from reflectrl.runlog import read_metrics

from .scripted import script


@pytest.mark.parametrize("algo,flags", [
    ("refgrpo", ["--refgrpo-reward", "balanced"]),
    ("refgrpo", ["--refgrpo-reward", "balanced", "--refgrpo-credit", "split"]),
    ("refgrpo", ["--refgrpo-reward", "rank", "--refgrpo-credit", "split"]),
    ("rlcr", ["--rlcr-calibration", "rank", "--rlcr-credit", "split"]),
    ("rlcr", ["--rlcr-calibration", "rank-balanced", "--rlcr-credit", "split"]),
    ("rlcr", ["--rlcr-calibration", "batch-rank", "--rlcr-credit", "split"]),
])
def test_new_flags_train_through_the_cli(tiny_dir, tmp_path, capsys, algo, flags):
    run = tmp_path / "r"
    code = main(["llm", "train", "--algo", algo, "--task", "toy-add", "--model", str(tiny_dir), "--run-dir", str(run),
                 "--updates", "2", "--prompts-per-update", "2", "--group-size", "4", "--max-new-tokens", "6",
                 "--reward-workers", "0", "--no-progress", "--no-tensorboard", "--no-export-model", *flags])
    assert code == 0, capsys.readouterr().err
    recs = read_metrics(run / "metrics.jsonl")
    assert len(recs) == 2 and all("selfreport/constant" in r for r in recs)
    cfg = (run / "config.json").read_text()
    assert f'"{flags[1]}"' in cfg  # the option is recorded (a resume continues with it)


@pytest.mark.parametrize("kind", ["rank", "rank-balanced", "batch-rank"])
def test_rlcr_rank_without_split_is_one_error(tiny_dir, capsys, kind):
    code = main(["llm", "train", "--algo", "rlcr", "--task", "toy-add", "--model", str(tiny_dir),
                 "--rlcr-calibration", kind, "--no-progress"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1
    assert re.search(rf"^error: --rlcr-calibration {kind} takes --rlcr-credit split", lines[0]), lines[0]


@pytest.mark.parametrize("algo,opts", [
    ("refgrpo", {"refgrpo_reward": "balanced", "refgrpo_credit": "split"}),
    ("refgrpo", {"refgrpo_reward": "rank", "refgrpo_credit": "split"}),
    ("rlcr", {"rlcr_calibration": "rank", "rlcr_credit": "split"}),
    ("refgrpo", {"refgrpo_reward": "rank-balanced", "refgrpo_credit": "split"}),
    ("rlcr", {"rlcr_calibration": "rank-balanced", "rlcr_credit": "split"}),
    ("refgrpo", {"refgrpo_reward": "batch-rank", "refgrpo_credit": "split"}),
    ("rlcr", {"rlcr_calibration": "batch-rank", "rlcr_credit": "split"}),
])
def test_report_turn_takes_the_new_term_s_group_advantage(tiny_dir, tmp_path, algo, opts):
    """Scripted answers (right and wrong in every group, both reports each): the report turn's tokens carry the
    group advantage of the new term, computed here from the batch's own outcomes and reports; the answer's tokens
    the outcome's."""
    cfg = get_algo("llm", algo).config(task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / "r"), updates=1,
                                       prompts_per_update=3, group_size=4, max_new_tokens=9, progress=False,
                                       tensorboard=False, reward_workers=0, export_model=False, **opts)
    t = script(get_algo("llm", algo).make(cfg))
    t.learn()
    b = t.last_batch
    groups = torch.arange(b.rows) // 4
    correct = b.correct.float()
    key = "reflection" if algo == "refgrpo" else "confidence"
    report = as_nan([i[-1].get(key) for i in b.infos])
    kind = opts.get("rlcr_calibration") or opts["refgrpo_reward"]
    pools = torch.zeros_like(groups) if kind == "batch-rank" else groups  # batch-rank: the batch is one pool
    if kind == "balanced":
        term = balanced_reflection_bonus(correct, report, 0.1, groups)
    else:
        term = group_rank_reward(correct, report, pools, balanced=kind != "rank")
        term = term if algo == "rlcr" else 0.1 * term
    scaled = group_advantages if kind in ("balanced", "rank") else batch_scaled_advantages
    want_report, want_answer = scaled(term, pools), group_advantages(correct, groups)
    assert want_report.abs().sum() > 0 and not torch.isnan(report).any()  # not vacuous
    for r in range(b.rows):
        m = b.completion_mask[r]
        turn, adv = b.turn_ids[r][m], b.advantages[r][m]
        torch.testing.assert_close(adv[turn == 1], want_report[r].expand(int((turn == 1).sum())))
        torch.testing.assert_close(adv[turn == 0], want_answer[r].expand(int((turn == 0).sum())))
