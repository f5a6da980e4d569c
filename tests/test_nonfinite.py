"""A NaN or inf in an observation, a reward (so an advantage) or a loss stops a run with one message naming
the update and the tensor, keeps the last good checkpoint (``--on-nonfinite stop``, the default), or is
left out (``--on-nonfinite skip``): PPO, DQN and GRPO, each through the CLI (in-process)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from reflectrl.checkpoint import load_checkpoint
from reflectrl.cli import main

PPO_FLAGS = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2",
             "--update-epochs", "1", "--total-timesteps", str(5 * 64), "--save-interval", "1", "--no-progress",
             "--no-tensorboard"]
DQN_FLAGS = ["--algo", "dqn", "--env-id", "CartPole-v1", "--total-timesteps", "640", "--learning-starts", "64",
             "--train-frequency", "1", "--batch-size", "16", "--buffer-size", "640", "--log-interval", "128",
             "--save-interval", "1", "--no-progress", "--no-tensorboard"]


class PoisonedEnvs:
    """A vector env whose ``step`` returns NaN in ``field`` (obs or reward) from its ``after``-th call on."""

    def __init__(self, envs, field: str, after: int):
        self._envs, self._field, self._after, self._calls = envs, field, after, 0

    def step(self, actions):
        obs, rew, term, trunc, info = self._envs.step(actions)
        self._calls += 1
        if self._calls >= self._after:
            if self._field == "obs":
                obs = np.full_like(obs, np.nan)
            else:
                rew = np.full_like(np.asarray(rew, np.float64), np.nan)
        return obs, rew, term, trunc, info

    def __getattr__(self, name):
        return getattr(self._envs, name)


def poison_envs(monkeypatch, module, field: str, after: int) -> None:
    """``module.make_vector_env`` builds poisoned training envs (a one-env probe stays clean)."""
    real = module.make_vector_env

    def make(env_id, num_envs, *a, **kw):
        envs = real(env_id, num_envs, *a, **kw)
        return envs if num_envs == 1 and module.__name__.endswith("ppo") else PoisonedEnvs(envs, field, after)

    monkeypatch.setattr(module, "make_vector_env", make)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def checkpoint_update(run) -> int:
    tensors, meta = load_checkpoint(run / "checkpoint.safetensors")
    weights = [n for n in tensors if n.split("/")[0] in ("model", "q", "q_target", "policy", "optim")]
    assert weights
    for name in weights:
        t = tensors[name]
        if t.is_floating_point():
            assert bool(torch.isfinite(t).all()), f"the kept checkpoint holds non-finite {name}"
    return int(meta["update"])


def records(run) -> list[dict]:
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]


def assert_stops(capsys, rc, run, tensor: str, update: int) -> str:
    line = error_line(capsys)
    assert rc == 2
    assert re.search(rf"non-finite values \(NaN or inf\) in the {tensor} at update {update}\b", line), line
    assert f"its last checkpoint, of update {update - 1}, in {run} is kept" in line, line
    assert "--on-nonfinite skip" in line
    assert checkpoint_update(run) == update - 1
    assert [r["update"] for r in records(run)] == list(range(1, update))
    return line


# ----------------------------------------------------------------------------------------------- PPO
@pytest.mark.parametrize("field,tensor", [("reward", "advantages"), ("obs", "(advantages|observations)")])
def test_ppo_nan_env_values_stop_the_run(tmp_path, monkeypatch, capsys, field, tensor):
    import reflectrl.control.ppo as ppo

    poison_envs(monkeypatch, ppo, field, after=2 * 32 + 5)  # in the third rollout
    run = tmp_path / "r"
    rc = main(["train", *PPO_FLAGS, "--run-dir", str(run)])
    assert_stops(capsys, rc, run, tensor, 3)


def nan_loss_from(monkeypatch, module, name: str, call: int) -> None:
    """``module.name`` (a loss) returns NaN from its ``call``-th call on."""
    real, calls = getattr(module, name), [0]

    def poisoned(*a, **kw):
        out = real(*a, **kw)
        calls[0] += 1
        if calls[0] < call:
            return out
        if isinstance(out, tuple):
            return (out[0] * float("nan"), *out[1:])
        return out * float("nan")

    monkeypatch.setattr(module, name, poisoned)


def test_ppo_nan_loss_stops_the_run(tmp_path, monkeypatch, capsys):
    import reflectrl.control.ppo as ppo

    nan_loss_from(monkeypatch, ppo, "value_loss", call=2 * 2 + 1)  # 2 minibatches per update: update 3
    run = tmp_path / "r"
    rc = main(["train", *PPO_FLAGS, "--run-dir", str(run)])
    assert "epoch minibatch starting at 0" in assert_stops(capsys, rc, run, "loss", 3)


def test_ppo_skip_leaves_the_poisoned_steps_out(tmp_path, monkeypatch, capsys):
    import reflectrl.control.ppo as ppo

    poison_envs(monkeypatch, ppo, "reward", after=2 * 32 + 5)
    run = tmp_path / "r"
    assert main(["train", *PPO_FLAGS, "--run-dir", str(run), "--on-nonfinite", "skip"]) == 0, capsys.readouterr().err
    recs = records(run)
    assert [r["update"] for r in recs] == [1, 2, 3, 4, 5]
    assert "health/skipped" not in recs[1] and recs[2]["health/skipped"] == 1 and recs[4]["health/skipped"] == 3
    assert checkpoint_update(run) == 5  # the model it kept training is finite


def test_a_nan_before_the_first_checkpoint_says_there_is_none(tmp_path, monkeypatch, capsys):
    import reflectrl.control.ppo as ppo

    poison_envs(monkeypatch, ppo, "reward", after=1)
    run = tmp_path / "r"
    rc = main(["train", *PPO_FLAGS, "--run-dir", str(run), "--save-interval", "10"])
    line = error_line(capsys)
    assert rc == 2 and "at update 1" in line and f"it wrote no checkpoint before, so {run} holds none" in line
    assert not (run / "checkpoint.safetensors").exists()


# ----------------------------------------------------------------------------------------------- DQN
@pytest.mark.parametrize("field", ["reward", "obs"])
def test_dqn_nan_env_values_stop_the_run(tmp_path, monkeypatch, capsys, field):
    import reflectrl.control.dqn as dqn

    poison_envs(monkeypatch, dqn, field, after=300)  # in the third record (128 env steps each)
    run = tmp_path / "r"
    rc = main(["train", *DQN_FLAGS, "--run-dir", str(run)])
    line = error_line(capsys)
    assert rc == 2 and re.search(r"in the TD loss at update 3, env step 3\d\d\b", line), line
    assert f"its last checkpoint, of update 2, in {run} is kept" in line
    assert checkpoint_update(run) == 2


def test_dqn_skip_goes_on(tmp_path, monkeypatch, capsys):
    import reflectrl.control.dqn as dqn

    poison_envs(monkeypatch, dqn, "reward", after=300)
    run = tmp_path / "r"
    assert main(["train", *DQN_FLAGS, "--run-dir", str(run), "--on-nonfinite", "skip"]) == 0, capsys.readouterr().err
    recs = records(run)
    assert len(recs) == 5 and recs[-1]["health/skipped"] > 0 and "health/skipped" not in recs[1]
    assert checkpoint_update(run) == 5


# ---------------------------------------------------------------------------------------------- GRPO
class NanAdd:
    """Single-digit addition whose reward is NaN while ``poison`` is set."""

    name = "nan-add"
    multi_turn = False
    poison = False

    def __init__(self) -> None:
        pairs = [(a, b) for a in range(10) for b in range(10)]
        self._splits = {"train": pairs[:64], "heldout": pairs[64:80]}

    def problems(self, split: str):
        from reflectrl.tasks.base import Problem

        return [Problem(f"{split}-{a}+{b}", f"{a}+{b}=", str(a + b)) for a, b in self._splits[split]]

    def score(self, problem, completion: str) -> float:
        return math.nan if NanAdd.poison else float(completion.strip() == problem.answer)

    def demonstration(self, problem) -> str:
        return problem.answer

    def make_env(self):
        from reflectrl.tasks.base import SingleTurnEnv

        return SingleTurnEnv(self)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.tasks.base import TASKS, register_task

    if "nan-add" not in TASKS:
        register_task("nan-add")(NanAdd)
    return init_tiny(tmp_path_factory.mktemp("tiny") / "m", layers=1, width=32, heads=2, max_positions=128)


def grpo_args(tiny, run) -> list[str]:
    return ["llm", "train", "--task", "nan-add", "--model", str(tiny), "--prompts-per-update", "2", "--group-size",
            "2", "--max-new-tokens", "3", "--updates", "4", "--save-interval", "1", "--learning-rate", "1e-3",
            "--run-dir", str(run), "--no-progress", "--no-tensorboard"]


def poison_rewards_from(monkeypatch, update: int) -> None:
    from reflectrl.llm.grpo import GRPO

    real = GRPO.iteration

    def iteration(self):
        NanAdd.poison = self.update_idx + 1 >= update
        return real(self)

    monkeypatch.setattr(GRPO, "iteration", iteration)
    monkeypatch.setattr(NanAdd, "poison", False)


def test_grpo_nan_rewards_stop_the_run(tiny, tmp_path, monkeypatch, capsys):
    poison_rewards_from(monkeypatch, 3)
    run = tmp_path / "g"
    assert_stops(capsys, main(grpo_args(tiny, run)), run, "advantages", 3)


def test_grpo_nan_loss_stops_the_run_and_skip_goes_on(tiny, tmp_path, monkeypatch, capsys):
    from reflectrl.llm import update

    real = update.PolicyUpdate.micro_loss

    def micro_loss(self, *a, **kw):
        loss, stats = real(self, *a, **kw)
        return (loss * float("nan"), stats) if self.update_idx >= 3 else (loss, stats)

    monkeypatch.setattr(update.PolicyUpdate, "micro_loss", micro_loss)
    run = tmp_path / "g"
    assert_stops(capsys, main(grpo_args(tiny, run)), run, "loss", 3)
    run2 = tmp_path / "g2"
    assert main([*grpo_args(tiny, run2), "--on-nonfinite", "skip"]) == 0, capsys.readouterr().err
    recs = records(run2)
    assert [r["update"] for r in recs] == [1, 2, 3, 4]
    assert recs[1]["losses/optimizer_steps"] == 1 and recs[2]["losses/optimizer_steps"] == 0
    assert recs[3]["health/skipped"] == 2 and checkpoint_update(run2) == 4


def test_llm_eval_writes_strict_json_where_a_value_is_not_finite(tmp_path, capsys, monkeypatch):
    """``llm eval --json`` and ``--transcripts`` write null, never a bare NaN, where a value is not a number."""

    from reflectrl.llm import evaluate as ev
    from reflectrl.llm.tiny import init_tiny

    model = init_tiny(tmp_path / "m", layers=1, width=16, heads=2, max_positions=64)
    real = ev.evaluate

    def with_nan(*a, **kw):
        res = real(*a, **kw)
        res["mean_score"] = float("nan")
        for ep in res.get("episodes", []):
            ep["infos"] = [{"confidence": float("nan")}]
        return res

    monkeypatch.setattr(ev, "evaluate", with_nan)
    out = tmp_path / "t.jsonl"
    assert main(["llm", "eval", str(model), "--task", "arith", "--limit", "2", "--json", "--transcripts", str(out),
                 "--no-progress"]) == 0
    refuse = lambda word: pytest.fail(f"not strict JSON: {word}")  # noqa: E731
    assert json.loads(capsys.readouterr().out, parse_constant=refuse)["mean_score"] is None
    rows = [json.loads(line, parse_constant=refuse) for line in out.read_text().splitlines()]
    assert rows and all(r["infos"] == [{"confidence": None}] for r in rows)
