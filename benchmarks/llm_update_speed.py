"""A whole GRPO update at a task's recipe, as it ran before the speed work and as it runs now, alternating in one process.

    python benchmarks/llm_update_speed.py --task text2sql --out runs/bench/update_speed \
        --json-out benchmarks/results/llm_update_speed_text2sql.json
    python benchmarks/llm_update_speed.py --render llm_update_speed_text2sql.json [...]

The model is the recipe's warm-up (``reflectrl llm init-tiny`` and ``llm warmup`` with the recipe's flags, into
``OUT/TASK/warmup``; kept when it is there). Each round trains ``--updates`` GRPO updates from it with the recipe's
train flags (and task options), a fresh trainer per arm, the arms in turn:

- **before**: ``--engine-options reuse_cache=false append_cache=false lean_step=false --old-logp recompute``: every
  turn prefills its whole transcript again, each decoding step concatenates the KV cache (transformers'
  ``DynamicCache``) in the model's own forward, and a no-grad pass computes the old log-probs (how every update ran
  before the speed work);
- **default**: the trainer's defaults (the kept cache on a multi-turn task, the cache appended in place; the
  no-grad pass);
- **engine log-probs**: the defaults and ``--old-logp engine`` (the sampler's log-probs as the old ones, no pass);
- **engine log-probs, causal layout**: and ``--attention causal`` (the training forward without a padding mask);
- **... length-packed micro-batches**: and ``--micro-batch-tokens 4096`` (each minibatch's rows sorted by length and
  packed into micro-batches of at most 4096 padded tokens);
- **engine log-probs, shared prompt**: the defaults, ``--old-logp engine`` and ``--attention shared-prompt`` (each
  distinct prompt of a micro-batch run once in the update's forward and backward);
- **... packed groups**: and ``--micro-batch-tokens 4096`` (a prompt's rows kept together, micro-batches of at most
  4096 tokens as the shared-prompt layout computes them);
- **... and the forward at every decoding step**: the same with ``--engine-options lean_step=false`` (the model's
  forward at each sampling step in place of the lean step; the same tokens), which times the lean step alone.

``--arms`` times a subset (with before).

``--paired``: on a task with dynamic sampling (rag's recipe) the arms' runs drift apart by float rounding after the
first update, and a run that drifts draws a different number of generation batches per update, so the arms would
not do the same work. With ``--paired`` the before arm is first run once, untimed, keeping the trainer's state
(``Trainer.state()``: the policy, optimizer, random streams and counters) before each of its updates; every arm's
update k then starts from that state (``load_state``), so every arm samples the same episodes in every update (the
result says whether it did) and the arms differ only in how they compute them.

Per arm: process CPU seconds per update (``time.process_time``, all threads of this process; the median over rounds
of the mean over the updates after ``--skip``), the phases' wall seconds per update from the run's ``time/*`` fields,
and whether the first update's episodes and rewards are the same as the before arm's (they must be: the arms differ
in how the tokens are computed, not in which are drawn); the largest difference of its loss metrics from the before
arm's (the log-probs differ within float rounding, so later updates may drift apart). Each arm's speedup over before
is the median (and range) of the per-round paired ratios; the arms' order rotates every round, and the machine's load
averages before each round are kept (``per_round``). The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import resultio
from llm_learn import preset, run

ARMS = {"before": ["--engine-options", "reuse_cache=false", "append_cache=false", "lean_step=false", "--old-logp",
                   "recompute"], "default": [],
        "engine log-probs": ["--old-logp", "engine"],
        "engine log-probs, causal layout": ["--old-logp", "engine", "--attention", "causal"],
        "engine log-probs, causal layout, length-packed micro-batches": [
            "--old-logp", "engine", "--attention", "causal", "--micro-batch-tokens", "4096"],
        "engine log-probs, shared prompt": ["--old-logp", "engine", "--attention", "shared-prompt"],
        "engine log-probs, shared prompt, packed groups": ["--old-logp", "engine", "--attention", "shared-prompt",
                                                           "--micro-batch-tokens", "4096"],
        "... and the forward at every decoding step": ["--old-logp", "engine", "--attention", "shared-prompt",
                                                       "--micro-batch-tokens", "4096", "--engine-options",
                                                       "lean_step=false"]}
PHASES = ("generate", "prefill", "reward_wait", "prepare", "update")


def warmed_up(task: str, out: Path) -> Path:
    """The recipe's warm-up of ``task`` under ``out`` (made when missing)."""
    p, tiny, warm = preset(task), out / task / "tiny", out / task / "warmup"
    if not (warm / "config.json").is_file():
        (out / task).mkdir(parents=True, exist_ok=True)
        log = out / task / "stderr.log"
        run(["llm", "init-tiny", str(tiny), *p["tiny"], "--seed", "1"], log)
        run(["llm", "warmup", "--model", str(tiny), "--task", task, "--out", str(warm), *p["warmup"],
             "--stop-at-accuracy", str(p["warmup_target"]), "--max-new-tokens", str(p["max_new_tokens"]),
             "--seed", "1", "--threads", "1", "--no-progress"], log)
    return warm


def trainer_for(task: str, model: Path, run_dir: Path, flags: list[str], updates: int) -> Any:
    """A fresh GRPO trainer at the recipe's train settings with ``flags``."""
    from reflectrl.algos import config_for_algo
    from reflectrl.cli.util import config_from_flags
    from reflectrl.llm.grpo import GRPO
    p = preset(task)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    base = config_for_algo("grpo", task=task, model=str(model), run_dir=str(run_dir), updates=updates, seed=1,
                           progress=False, tensorboard=False, save_interval=0, sample_interval=0, export_model=False,
                           threads=1)
    cfg = config_from_flags(base, [*p["train"], "--max-new-tokens", str(p["max_new_tokens"]), *flags],
                            "update_speed", "llm", False)
    return GRPO(cfg)


def reference(task: str, model: Path, run_dir: Path, updates: int) -> dict[str, Any]:
    """``--paired``: the before arm's run, untimed: the trainer's state before each update (what every arm's update
    starts from), and each update's episodes and mean reward."""
    trainer = trainer_for(task, model, run_dir, ARMS["before"], updates)
    states, episodes, rewards = [], [], []
    for _ in range(updates):
        tensors, meta = trainer.state()
        states.append(({k: v.detach().clone() for k, v in tensors.items()}, copy.deepcopy(meta)))
        rec = trainer.iteration()
        episodes.append(trainer.last_batch.transcripts)
        rewards.append(rec["reward/mean"])
    trainer.rollout.close()
    return {"states": states, "episodes": episodes, "rewards": rewards}


def one_arm(task: str, model: Path, run_dir: Path, flags: list[str], updates: int, skip: int,
            ref: dict[str, Any] | None = None) -> dict[str, Any]:
    """``updates`` GRPO updates at the recipe with ``flags``: CPU s per update after ``skip``, the phases, update 1.
    With ``ref`` (``--paired``), update k starts from the state the before arm's update k started from, and the
    result says whether every update drew the before arm's episodes and rewards."""
    trainer = trainer_for(task, model, run_dir, flags, updates)
    cpu, recs, first, same = [], [], None, True
    for i in range(updates):
        if ref is not None:
            trainer.load_state(*ref["states"][i])
        c0 = time.process_time()
        recs.append(trainer.iteration())
        cpu.append(time.process_time() - c0)
        if i == 0:
            first = trainer.last_batch.transcripts
        if ref is not None:
            same = same and trainer.last_batch.transcripts == ref["episodes"][i] and \
                recs[-1]["reward/mean"] == ref["rewards"][i]
    trainer.rollout.close()
    kept = recs[skip:]
    return {"cpu_s": statistics.fmean(cpu[skip:]),
            "phases": {p: statistics.fmean(float(x.get(f"time/{p}", 0.0)) for x in kept) for p in PHASES},
            "first": first, "first_record": recs[0], "every_update_same": same}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    model = warmed_up(a.task, Path(a.out))
    arms = {k: v for k, v in ARMS.items() if k == "before" or not a.arms or k in a.arms}
    per: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
    ref = reference(a.task, model, Path(a.out) / a.task / "runs" / "reference", a.updates) if a.paired else None
    per_round = []
    for rnd in range(a.rounds):
        order = list(arms)[rnd % len(arms):] + list(arms)[:rnd % len(arms)]  # rotated: no arm always first or last
        per_round.append({"round": rnd + 1, "order": order, "load_before": resultio.load_average()})
        for arm in order:
            flags = arms[arm]
            res = one_arm(a.task, model, Path(a.out) / a.task / "runs" / f"{arm.replace(' ', '_')}_{rnd}", flags,
                          a.updates, a.skip, ref)
            per[arm].append(res)
            print(f"round {rnd + 1} {arm}: {res['cpu_s']:.3f} CPU s per update", flush=True)
    before = per["before"][0]
    arms = {}
    for arm, runs in per.items():
        first = runs[0]["first_record"]
        losses = [k for k in first if k.startswith("losses/") and k != "losses/optimizer_steps"]
        arms[arm] = {
            "cpu_s_per_update": statistics.median(x["cpu_s"] for x in runs),
            "rounds": [round(x["cpu_s"], 4) for x in runs],
            "phases": {p: statistics.median(x["phases"][p] for x in runs) for p in PHASES},
            "same_first_episodes": all(x["first"] == before["first"] for x in runs),
            "same_first_rewards": all(x["first_record"]["reward/mean"] == before["first_record"]["reward/mean"]
                                      for x in runs),
            "first_loss_max_diff": max((abs(float(first[k]) - float(before["first_record"][k])) for k in losses),
                                       default=0.0),
            **({"every_update_same": all(x["every_update_same"] for x in runs)} if a.paired else {})}
    return speedups({"benchmark": "llm_update_speed", "task": a.task, "updates": a.updates, "skip": a.skip,
                     "rounds": a.rounds, "paired": a.paired, "clock": "process CPU time (threads=1)", "arms": arms,
                     "per_round": per_round})


def speedups(result: dict[str, Any]) -> dict[str, Any]:
    """Each arm's speedup over before: the median (and range) of the per-round paired ratios, before's CPU seconds
    per update over the arm's in the same round."""
    before = result["arms"]["before"]["rounds"]
    for v in result["arms"].values():
        r = resultio.paired_ratios(before, v["rounds"])
        v["speedup"], v["speedup_range"] = r["median"], r["range"]
    return result


def render(names: list[str]) -> str:
    results = [json.loads(resultio.results_file(n).read_text()) for n in names]
    paired = all(r.get("paired") for r in results)
    lines = ["| task | arm | CPU s per update (median) | speedup over before | speedup per round | generate s | "
             "prefill s | no-grad pass s | update s | " + ("every update: " if paired else "update 1: ")
             + "same episodes and rewards | update 1: largest loss-metric difference |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        before = r["arms"]["before"]["rounds"]
        for arm, v in r["arms"].items():
            ph = v["phases"]
            same = "yes" if v["same_first_episodes"] and v["same_first_rewards"] and \
                (not paired or v["every_update_same"]) else "no"
            rounds = ", ".join(f"{b / x:.2f}" for b, x in zip(before, v["rounds"]))
            lines.append(f"| {r['task']} | {arm} | {v['cpu_s_per_update']:.3f} | {v['speedup']:.2f}x | {rounds} | "
                         f"{ph['generate']:.3f} | {ph['prefill']:.3f} | {ph['prepare']:.3f} | {ph['update']:.3f} | "
                         f"{same} | {v['first_loss_max_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default=None, choices=["text2sql", "rag", "arith", "codegen"])
    ap.add_argument("--out", default="runs/bench/update_speed", help="the warm-ups and the runs go here")
    ap.add_argument("--updates", type=int, default=6, help="updates per arm and round")
    ap.add_argument("--skip", type=int, default=1, help="updates left out of the CPU mean (start-up)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paired", action="store_true",
                    help="every arm's update k starts from the state the before arm's update k started from (the "
                         "before arm's run, made once, untimed), so that every arm does the same updates' work")
    ap.add_argument("--arms", nargs="+", default=None, choices=list(ARMS), metavar="ARM",
                    help="time only these arms (and before, which every speedup is over); default: every arm")
    resultio.main(ap, measure, render, needs="task")


if __name__ == "__main__":
    main()
