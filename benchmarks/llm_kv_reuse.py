"""Multi-turn rollouts with and without the kept KV cache (``--engine-options reuse_cache=true``).

    python benchmarks/llm_kv_reuse.py --task text2sql [--model DIR|NAME] [--prompts 8] [--group-size 4] [--rounds 3]
        [--json-out F]
    python benchmarks/llm_kv_reuse.py --render F [F ...]

Each round rolls out the same problems with the same generator twice, in one process and alternating which goes
first: with the torch engine as it was (every turn prefills its whole transcript again) and with ``reuse_cache``
(each turn prefills only what the last one added). It reports the process CPU seconds of a rollout (all threads;
median over rounds), the seconds spent prefilling, the speedup as the median (and range) of the per-round paired
ratios, the machine's load averages before each round, and whether the two rollouts gave the same
episodes, token for token. Without ``--model`` the model is a random-init tiny one, whose turns run to the token
limit: the longest transcripts the task allows. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resultio import load_average, paired_ratios, results_file  # noqa: E402
from resultio import main as run  # noqa: E402


def rollout(policy: Any, task: Any, reuse: bool, a: argparse.Namespace) -> tuple[float, float, list]:
    import torch

    from reflectrl.llm.engines import make_engine
    from reflectrl.llm.rollout import Rollout

    engine = make_engine("torch", policy, temperature=a.temperature, reuse_cache=reuse)
    ro = Rollout(policy, engine, task, max_new_tokens=a.max_new_tokens, max_turns=a.max_turns,
                 max_response_tokens=a.max_response_tokens, gen_batch=a.prompts * a.group_size, reward_workers=0)
    c0 = time.process_time()
    batch, stats = ro.run(task.problems("train")[:a.prompts], a.group_size, torch.Generator().manual_seed(a.seed))
    cpu = time.process_time() - c0
    ro.close()
    return cpu, stats.prefill_s, batch.transcripts


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.llm.policy import load_policy
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.tasks.base import get_task, parse_options
    from reflectrl.tasks.selfreport import with_self_report

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or str(init_tiny(Path(tmp) / "tiny", seed=a.seed))
        policy = load_policy(model)
        task = with_self_report(get_task(a.task, **parse_options(a.set)), a.self_report)
        cpu: dict[bool, list[float]] = {False: [], True: []}
        prefill: dict[bool, list[float]] = {False: [], True: []}
        same = True
        loads = []
        for r in range(a.rounds):
            loads.append(load_average())
            got = {}
            for reuse in (False, True) if r % 2 == 0 else (True, False):
                c, p, transcripts = rollout(policy, task, reuse, a)
                cpu[reuse].append(c)
                prefill[reuse].append(p)
                got[reuse] = transcripts
            same = same and got[False] == got[True]
            turns = statistics.mean(sum(1 for k, _ in t if k == "policy") for t in got[False])
    med = {k: statistics.median(v) for k, v in cpu.items()}
    pre = {k: statistics.median(v) for k, v in prefill.items()}
    ratio = paired_ratios(cpu[False], cpu[True])  # per round: without the cache over with it, the same round's load
    label = a.task + ("" if a.self_report == "off" else f", asked a {a.self_report}")
    return {"task": label, "model": a.model or "random-init tiny", "rows": a.prompts * a.group_size,
            "turns_per_episode": turns, "rounds": a.rounds, "threads": a.threads,
            "cpu_s": med[False], "cpu_s_reuse": med[True], "speedup": ratio["median"], "speedup_range": ratio["range"],
            "rounds_cpu_s": {"without": cpu[False], "with": cpu[True]}, "load_before": loads,
            "prefill_s": pre[False], "prefill_s_reuse": pre[True], "same_episodes": same,
            "command": " ".join(["python", "benchmarks/llm_kv_reuse.py", *sys.argv[1:]])}


def render(paths: list[str]) -> str:
    lines = ["| task | model | rows | agent turns per episode | CPU s per rollout | with the kept cache | speedup | "
             "prefill s | with the kept cache | same episodes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in paths:
        path = results_file(p)
        r = json.loads(path.read_text())
        lines.append(f"| {r['task']} | {r['model']} | {r['rows']} | {r['turns_per_episode']:.1f} | {r['cpu_s']:.2f} | "
                     f"{r['cpu_s_reuse']:.2f} | {r['speedup']:.2f}x{'' if 'speedup_range' in r else '*'} | "
                     f"{r['prefill_s']:.2f} | {r['prefill_s_reuse']:.2f} | "
                     f"{'yes' if r['same_episodes'] else 'no'} |")
    if any(line.count("x* |") for line in lines):
        lines += ["", "* a ratio of the medians: the file was written before the ratios were taken per round, and its "
                  "per-round times were not kept."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="text2sql")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a task option (repeatable)")
    ap.add_argument("--self-report", default="off", choices=("off", "reflect", "confidence"),
                    help="ask for a self-report when each episode ends (one more turn)")
    ap.add_argument("--model", help="a model directory or known name (default: a random-init tiny model)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-response-tokens", type=int, default=1024)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    run(ap, measure, render)


if __name__ == "__main__":
    main()
