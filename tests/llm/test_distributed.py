"""Data-parallel GRPO across processes on the CPU (gloo): two processes that each update on their half of the
groups end with the weights one process gets from the whole batch (minibatches=1; with both loss
normalizations and with gradient accumulation), and (slow) a torchrun run writes one run directory that a single
process resumes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reflectrl.algos import resume
from reflectrl.llm.distributed import SINGLE, combine_records, rank_seed, shard
from reflectrl.llm.grpo import GRPO
from reflectrl.runlog import read_metrics
from reflectrl.trainer import CHECKPOINT

from .test_trainer import cfg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = [("seq-mean-token-mean", 1), ("token-mean", 2), ("seq-mean-token-sum-norm", 2)]

# One process's part: build the same trainer and batch as the test, update on this process's groups, save the
# gradients and weights. Run as `python -c` in each process, with torchrun's environment variables.
WORKER = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
from toytasks import AddTask
from reflectrl.tasks.base import TASKS, register_task
if "toy-add" not in TASKS:
    register_task("toy-add")(AddTask)
from test_distributed_case import run_case
out = {mode: run_case(sys.argv[2], sys.argv[3], mode, accum) for mode, accum in %r}
torch.save(out, f"{sys.argv[3]}/rank{torch.distributed.get_rank()}.pt")
torch.distributed.destroy_process_group()
""".replace("%r", repr(CASES))

CASE = r'''
import torch
from reflectrl.algos import config_for_algo
from reflectrl.llm.batch import RowResult, Segment, build_batch
from reflectrl.llm.distributed import shard
from reflectrl.llm.grpo import GRPO


def case_batch():
    """4 groups of 3 rows, rewards that vary within groups, rows of 1 to 4 tokens (the first two groups shorter:
    per-process token counts differ, so only global normalizers give the one-process loss)."""
    scores = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0]
    lens = [1, 2, 1, 2, 1, 1, 4, 3, 4, 2, 4, 3]
    rows = [RowResult([5, 6 + i % 3], [Segment([7 + (i + j) % 11 for j in range(n)], "policy", 0, s)], None, s, s >= 1,
                      False, []) for i, (s, n) in enumerate(zip(scores, lens))]
    return build_batch(rows, [i // 3 for i in range(12)], [], 0)


def run_case(tiny_dir, run_dir, mode, accum):
    t = GRPO(config_for_algo("grpo", task="toy-add", model=tiny_dir, run_dir=f"{run_dir}/{mode}", prompts_per_update=4,
                             group_size=3, learning_rate=3e-3, loss_agg_mode=mode, grad_accum=accum, progress=False,
                             tensorboard=False, kl_coef=0.05, entropy_coef=0.01))
    b = case_batch()
    t.prepare(b)
    t.advantages(b)
    lo, hi = shard(4, t.dist.rank, t.dist.world)
    t.update_idx = 1
    rec = t.update(b.select(list(range(3 * lo, 3 * hi))))
    params = t.policy.trainable_parameters()
    return {"grads": torch.cat([p.grad.flatten() for p in params]), "weights": torch.cat([p.detach().flatten() for p in params]),
            "rec": t.dist.combine_record(rec, 3 * (hi - lo))}
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(rank: int, world: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture
def case_module(tmp_path, monkeypatch):
    (tmp_path / "test_distributed_case.py").write_text(CASE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import test_distributed_case

    yield test_distributed_case
    sys.modules.pop("test_distributed_case", None)


def test_two_processes_equal_one_process_on_the_global_batch(tiny_dir, tmp_path, case_module):
    port = free_port()
    argv = [sys.executable, "-c", WORKER, str(HERE), str(tiny_dir), str(tmp_path)]
    env = lambda r: {**env_for(r, 2, port), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    procs = [subprocess.Popen(argv, env=env(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-4000:]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for mode, accum in CASES:
        one = case_module.run_case(str(tiny_dir), str(tmp_path / "single"), mode, accum)
        a, b = got[0][mode], got[1][mode]
        assert torch.equal(a["weights"], b["weights"]), mode  # the replicas stay equal
        assert torch.allclose(a["grads"], one["grads"], atol=1e-7, rtol=1e-4), mode  # the summed (clipped) gradients
        # after one Adam step (lr 3e-3) the weights agree to 1% of a step: Adam divides by |g| + eps, so a gradient
        # near eps (1e-8) moves by its float-sum rounding
        assert torch.allclose(a["weights"], one["weights"], atol=3e-5, rtol=0), mode
        assert int(((a["weights"] - one["weights"]).abs() > 1e-6).sum()) <= 3, mode
        for k in ("losses/policy_loss", "losses/entropy", "losses/kl", "losses/grad_norm"):
            assert a["rec"][k] == pytest.approx(one["rec"][k], rel=1e-4, abs=1e-7), (mode, k)


def test_shards_seeds_and_records():
    assert [shard(5, r, 2) for r in (0, 1)] == [(0, 2), (2, 5)]
    assert [shard(4, r, 3) for r in range(3)] == [(0, 1), (1, 2), (2, 4)]
    assert len({rank_seed(1, r, u) for r in range(4) for u in range(1, 50)}) == 4 * 49
    assert all(0 <= rank_seed(2**63 - 1, r, 9) < 2**63 for r in range(3))
    rec = combine_records([({"update": 2, "reward/mean": 1.0, "losses/policy_loss": 0.25, "losses/grad_norm": 3.0,
                             "rollout/generated_tokens": 10, "time/update": 1.0, "completion/max_length": 4.0, "tag": "a"}, 6),
                           ({"update": 2, "reward/mean": 0.0, "losses/policy_loss": 0.5, "losses/grad_norm": 3.0,
                             "rollout/generated_tokens": 5, "time/update": 2.0, "completion/max_length": 2.0, "tag": "b"}, 2)])
    assert rec == {"update": 2, "reward/mean": 0.75, "losses/policy_loss": 0.75, "losses/grad_norm": 3.0,
                   "rollout/generated_tokens": 15, "time/update": 2.0, "completion/max_length": 4.0, "tag": "a"}
    assert SINGLE.sum_floats([2.0]) == [2.0] and SINGLE.any(True, False) == (True, False)


def test_single_process_is_not_distributed(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    t = GRPO(cfg(tiny_dir, tmp_path, updates=1))
    assert t.dist is SINGLE and t.is_main and t.agree(False, True) == (False, True)


@pytest.mark.slow  # about 30 s: torchrun starts two interpreters that import torch and transformers
def test_torchrun_run_is_one_run_directory_and_resumes_in_one_process(tiny_dir, tmp_path):
    run = tmp_path / "run"  # not created beforehand: rank 0 alone probes and creates it
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "reflectrl",
            "llm", "train", "--task", "arith", "--model", str(tiny_dir), "--run-dir", str(run), "--updates", "2",
            "--prompts-per-update", "3", "--group-size", "2", "--max-new-tokens", "3", "--learning-rate", "3e-3",
            "--save-interval", "1", "--sample-interval", "1", "--no-progress", "--no-tensorboard", "--no-export-model"]
    env = env_for(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    summaries = [line for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and json.loads(summaries[0])["updates"] == 2  # one summary line, rank 0's
    recs = read_metrics(run / "metrics.jsonl")
    assert [r["update"] for r in recs] == [1, 2] and [r["global_step"] for r in recs] == [6, 12]  # both processes' rows
    assert (run / CHECKPOINT).is_file() and json.loads((run / "config.json").read_text())["updates"] == 2
    samples = [json.loads(l) for l in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["update"] for s in samples] == [1, 2]  # rank 0's first group, once per update
    t = resume(run, 3)
    assert t.dist is SINGLE and t.update_idx == 2 and t.global_step == 12
    t.learn()
    recs = read_metrics(run / "metrics.jsonl")
    assert [r["update"] for r in recs] == [1, 2, 3] and recs[-1]["global_step"] == 18
