"""GRPO step throughput: reflectrl vs TRL's GRPOTrainer on the same tiny model, task and shapes.

    python benchmarks/llm_throughput.py [--steps 8] [--rounds 3] [--out runs/bench/llm_throughput]

Both trainers run full GRPO steps (sample G completions per prompt, score them, then
``--minibatches`` optimizer steps on slices of the batch with the group-normalized clipped loss, no
KL) from the same tiny model on ``arith`` prompts, with the same group size, rows per step,
completion limit, temperature, learning rate, loss aggregation (per-sequence mean) and torch thread
count. The default model is a fresh init-tiny model after a short supervised warm-up on arith (what
RL starts from in ``llm_learn.py``; its completions are a few tokens); ``--sft-steps 0
--max-new-tokens 32 --minibatches 1 --rows 128`` times the random-init model instead. Each round runs each
trainer in a fresh process, in an order that alternates between rounds (reflectrl's arms first, then TRL; the next
round the reverse), with the machine's 1-, 5- and 15-minute load averages recorded before it (``per_round``),
warms up ``--warmup`` steps and times ``--steps``
steps, each trainer in its own loop (reflectrl's ``learn()``, TRL's ``train()``); throughput is completion
tokens generated per second of whole steps, timed by the process's
CPU clock (``time.process_time``, all threads) so that other load on a shared machine does not
skew the comparison (wall-clock figures are reported too), and the share of each arm's timed CPU that the
cyclic garbage collector took (``gc_share``, per round). TRL is a
benchmark-only dependency (``pip install trl``). ``--engines`` also times the two generation
engines of reflectrl alone. ``--engine-logp`` adds a third trainer to every round: reflectrl with ``--old-logp
engine`` (the sampler's log-probs as the old ones, no no-grad pass before the update); ``--shared-prompt`` one more:
reflectrl with ``--old-logp engine --attention shared-prompt`` (each distinct prompt of a micro-batch run once in the
update, forward and backward). The last line of output is one JSON object. Each speed ratio is the median (and
range) of the per-round paired ratios, reflectrl's arm over TRL in the same round (``ratio``, ``ratio_rounds``,
``ratio_range``; the ratio of the arms' medians stays as ``ratio_of_medians``); ``--recompute FILE`` writes them
into a result file from its per-round tokens per second, without running anything.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class GcClock:
    """CPU seconds of the cyclic garbage collector's runs that start while ``on`` (a timed step is running)."""

    def __init__(self) -> None:
        self.on, self.cpu, self._t, self._counted = False, 0.0, 0.0, False
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t, self._counted = time.process_time(), self.on
        elif self._counted:
            self.cpu += time.process_time() - self._t


def worker_reflectrl(a) -> dict:
    import torch

    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO

    cfg = config_for_algo("grpo", task="arith", model=a.model, run_dir=tempfile.mkdtemp(dir=a.tmp),
                          updates=a.warmup + a.steps, prompts_per_update=a.rows // a.group_size,
                          group_size=a.group_size, max_new_tokens=a.max_new_tokens, learning_rate=a.lr,
                          minibatches=a.minibatches, lora_r=a.lora_r, task_options=tuple(a.set),
                          temperature=a.temperature, loss_agg_mode="seq-mean-token-mean", clip_low=0.2, kl_coef=0.0,
                          threads=a.threads, progress=False, tensorboard=False, save_interval=0,
                          sample_interval=0, export_model=False, seed=a.seed, old_logp=a.old_logp,
                          attention=a.attention)
    trainer = GRPO(cfg)
    # the steps run in reflectrl's own loop (learn()), as TRL's run in its train(): each one timed on its own
    step, collector = trainer.iteration, GcClock()
    done, tokens, seconds, cpu = 0, 0, 0.0, 0.0

    def timed() -> dict:
        nonlocal done, tokens, seconds, cpu
        t0, c0 = time.perf_counter(), time.process_time()
        collector.on = done >= a.warmup
        rec = step()
        collector.on = False
        if done >= a.warmup:
            seconds += time.perf_counter() - t0
            cpu += time.process_time() - c0
            tokens += int(trainer.last_batch.completion_mask.sum())
        done += 1
        return rec

    trainer.iteration = timed
    trainer.learn()
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu, "gc_cpu_seconds": collector.cpu,
            "threads": torch.get_num_threads()}


def worker_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.llm.models import has_chat_template, resolve_model
    from reflectrl.tasks.base import chat_prompt, get_task, parse_options

    torch.set_num_threads(a.threads)
    task = get_task("arith", **parse_options(a.set))
    problems = {p.id: p for p in task.problems("train")}
    path = resolve_model(a.model)
    chat = has_chat_template(path)  # a chat model gets the same conversation reflectrl gives it (TRL applies the template)
    prompt = (lambda p: [{"role": "user", "content": chat_prompt(task, p)}]) if chat else (lambda p: p.prompt)
    data = Dataset.from_list([{"prompt": prompt(p), "pid": pid} for pid, p in problems.items()])
    counted = {"tokens": 0}

    def reward(completions, pid, completion_ids=None, **kw):
        counted["tokens"] += sum(len(c) for c in completion_ids)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [task.score(problems[i], c) for i, c in zip(pid, texts)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.c0, self.seconds, self.cpu, self.tokens, self.step = 0.0, 0.0, 0.0, 0.0, 0, 0

        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0, self.before = time.perf_counter(), time.process_time(), counted["tokens"]
            collector.on = self.step >= a.warmup * a.minibatches

        def on_step_end(self, args, state, control, **kw):
            collector.on = False
            self.step += 1
            if self.step > a.warmup * a.minibatches:
                self.seconds += time.perf_counter() - self.t0
                self.cpu += time.process_time() - self.c0
                self.tokens += counted["tokens"] - self.before

    timer, collector = Timer(), GcClock()
    # one generation of `rows` completions, then `minibatches` optimizer steps on slices of it (TRL then
    # computes old log-probs in an extra pass, as reflectrl does for minibatches > 1)
    args = GRPOConfig(
        output_dir=str(Path(a.tmp) / "trl"), per_device_train_batch_size=a.rows // a.minibatches,
        steps_per_generation=a.minibatches, num_generations=a.group_size,
        max_completion_length=a.max_new_tokens, max_steps=(a.warmup + a.steps) * a.minibatches,
        learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, num_iterations=1, epsilon=0.2,
        temperature=a.temperature, top_p=1.0, top_k=0, loss_type="grpo", scale_rewards="group", max_grad_norm=1.0,
        use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1000,
        log_completions=False, disable_dropout=True, dataloader_num_workers=0, seed=a.seed,
        adam_beta2=0.99, weight_decay=0.0,
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    # the same stop as reflectrl's sampler: the task's single-token stop sequences (arith: the newline) end generation
    from reflectrl.llm.rollout import single_token_stops
    from reflectrl.tasks.base import stop_sequences

    ends = sorted({tok.eos_token_id, *single_token_stops(tok, stop_sequences(task, chat=chat))})
    args.generation_kwargs = {"eos_token_id": ends}
    peft = None
    if a.lora_r:
        from peft import LoraConfig

        peft = LoraConfig(r=a.lora_r, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                          callbacks=[timer], peft_config=peft)
    trainer.train()
    return {"tokens": timer.tokens, "seconds": timer.seconds, "cpu_seconds": timer.cpu,
            "gc_cpu_seconds": collector.cpu, "threads": torch.get_num_threads()}


def worker_engines(a) -> dict:
    import torch

    from reflectrl.llm.engines import make_engine
    from reflectrl.llm.policy import load_policy
    from reflectrl.tasks.base import get_task

    torch.set_num_threads(a.threads)
    pol = load_policy(a.model)
    prompts = [pol.tokenizer(p.prompt)["input_ids"] for p in get_task("arith").problems("train")[:a.rows]]
    out = {}
    for name in ("torch", "hf", "torch", "hf"):
        eng = make_engine(name, pol)
        g = torch.Generator().manual_seed(0)
        c0 = time.process_time()
        ids = eng.generate(prompts, a.max_new_tokens, g)
        out.setdefault(name, []).append(sum(map(len, ids)) / (time.process_time() - c0))
    return {f"{k}_tokens_per_s": max(v) for k, v in out.items()}


ARMS = {"reflectrl": ("reflectrl", "auto", "auto"), "reflectrl_engine_logp": ("reflectrl", "engine", "padded"),
        "reflectrl_shared_prompt": ("reflectrl", "engine", "shared-prompt"), "trl": ("trl", None, None),
        "engines": ("engines", None, None)}
"""Per arm: its worker and, for reflectrl's, its --old-logp and --attention (auto: the trainer's defaults, which for a
chat model are the sampler's log-probs and the shared prompt; for a tiny model recompute and padded, as every run
before them was timed)."""


def spawn(arm: str, a, tmp: str) -> dict:
    kind, old_logp, attention = ARMS[arm]
    argv = [sys.executable, __file__, "--worker", kind, "--model", a.model, "--tmp", tmp]
    argv += ["--old-logp", old_logp, "--attention", attention] if old_logp and attention else []
    for k in ("rows", "group_size", "max_new_tokens", "steps", "warmup", "threads", "seed", "minibatches", "lora_r",
              "temperature"):
        argv += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    argv += ["--lr", str(a.lr)] + [x for o in a.set for x in ("--set", o)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false",
           "ACCELERATE_USE_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


RATIO_KEYS = (("reflectrl", "ratio"), ("reflectrl_engine_logp", "ratio_engine_logp"),
              ("reflectrl_shared_prompt", "ratio_shared_prompt"))
"""Each reflectrl arm and the key of its speed ratio over TRL."""


def ratio_fields(rounds: dict[str, list[float]]) -> dict:
    """The speed ratios of one result from its per-round tokens per second: per round, each reflectrl arm over TRL
    in the same round (a paired ratio: both ran under that round's load), then their median and range; the ratio of
    the arms' medians too, as ``*_of_medians``."""
    out: dict = {}
    for arm, key in RATIO_KEYS:
        if arm not in rounds:
            continue
        ratios = [mine / theirs for mine, theirs in zip(rounds[arm], rounds["trl"])]
        out.update({key: round(statistics.median(ratios), 3), f"{key}_rounds": [round(x, 3) for x in ratios],
                    f"{key}_range": [round(min(ratios), 3), round(max(ratios), 3)],
                    f"{key}_of_medians": round(statistics.median(rounds[arm]) / statistics.median(rounds["trl"]), 3)})
    return out


def recompute(path: Path) -> dict:
    """A result file with its ratios as medians of per-round paired ratios (from its ``rounds``; nothing is rerun).
    A file written before the arm order alternated says so in ``order``."""
    result = json.loads(path.read_text())
    result.update(ratio_fields(result["rounds"]))
    if "per_round" not in result:
        result["order"] = "the same in every round: reflectrl's arms first, TRL last (written before it alternated)"
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=["reflectrl", "trl", "engines"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help="model directory (default: a fresh `init-tiny` model, "
                    "fine-tuned for --sft-steps on arith demonstrations)")
    ap.add_argument("--sft-steps", type=int, default=300,
                    help="supervised steps on the fresh tiny model, so completions look like RL's (0: random init)")
    ap.add_argument("--rows", type=int, default=256, help="completions per step (prompts x group size)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--minibatches", type=int, default=4, help="optimizer steps per generated batch")
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (generated batches) per round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="arith option (e.g. ops=+)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--engines", action="store_true", help="also time reflectrl's two generation engines")
    ap.add_argument("--engine-logp", action="store_true",
                    help="also time reflectrl with --old-logp engine in every round (after reflectrl, before TRL)")
    ap.add_argument("--shared-prompt", action="store_true",
                    help="also time reflectrl with --old-logp engine --attention shared-prompt in every round")
    ap.add_argument("--old-logp", default="auto", choices=["auto", "recompute", "engine"], help=argparse.SUPPRESS)
    ap.add_argument("--attention", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the result JSON here too")
    ap.add_argument("--json-out", default=None, help="and to this file (e.g. benchmarks/results/NAME.json)")
    ap.add_argument("--recompute", type=Path, default=None, metavar="JSON",
                    help="write the per-round paired ratios and their median into this result file; run nothing")
    a = ap.parse_args()
    if a.recompute is not None:
        a.recompute.write_text(json.dumps(recompute(a.recompute), indent=2) + "\n")
        return
    if a.worker:
        fn = {"reflectrl": worker_reflectrl, "trl": worker_trl, "engines": worker_engines}[a.worker]
        print(json.dumps(fn(a)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_desc = a.model
        if a.model is None:
            from reflectrl.llm.tiny import init_tiny
            from reflectrl.llm.warmup import WarmupConfig, warmup

            a.model = str(init_tiny(Path(tmp) / "tiny", seed=0))
            model_desc = "init-tiny (llama, 2 layers, width 64)"
            if a.sft_steps:
                warmup(WarmupConfig(model=a.model, task="arith", out=str(Path(tmp) / "sft"), steps=a.sft_steps,
                                    batch_size=64, learning_rate=3e-3, progress=False))
                a.model = str(Path(tmp) / "sft")
                model_desc += f" + {a.sft_steps} supervised steps on arith"
        arms = ["reflectrl", *(["reflectrl_engine_logp"] if a.engine_logp else []),
                *(["reflectrl_shared_prompt"] if a.shared_prompt else []), "trl"]
        runs: dict[str, list[float]] = {k: [] for k in arms}
        wall: dict[str, list[float]] = {k: [] for k in arms}
        gc_share: dict[str, list[float]] = {k: [] for k in arms}
        per_round = []
        for r in range(a.rounds):
            order = arms if r % 2 == 0 else arms[::-1]  # alternate, so no arm always runs first or last
            per_round.append({"round": r + 1, "order": order, "load_before": [round(x, 2) for x in os.getloadavg()]})
            for kind in order:
                res = spawn(kind, a, tmp)
                runs[kind].append(res["tokens"] / res["cpu_seconds"])
                wall[kind].append(res["tokens"] / res["seconds"])
                gc_share[kind].append(res.get("gc_cpu_seconds", 0.0) / res["cpu_seconds"])
                print(f"round {r + 1} {kind}: {res['tokens']} tokens, {res['cpu_seconds']:.2f} CPU s "
                      f"({runs[kind][-1]:.0f} tokens per CPU-second), {res['seconds']:.2f} s wall, "
                      f"{gc_share[kind][-1]:.1%} of the CPU in the garbage collector", flush=True)
        engines = spawn("engines", a, tmp) if a.engines else {}
    import transformers
    import trl

    ours, theirs = statistics.median(runs["reflectrl"]), statistics.median(runs["trl"])
    result = {"benchmark": "llm_throughput", "reflectrl_tokens_per_s": round(ours, 1),
              "trl_tokens_per_s": round(theirs, 1), "clock": f"process CPU time (threads={a.threads})",
              "rounds": {k: [round(x, 1) for x in v] for k, v in runs.items()}, "per_round": per_round,
              "wall_tokens_per_s": {k: round(statistics.median(v), 1) for k, v in wall.items()},
              "gc_share": {k: [round(x, 4) for x in v] for k, v in gc_share.items()},
              "model": model_desc, "task": "arith", "group_size": a.group_size, "rows_per_step": a.rows,
              "minibatches": a.minibatches, "max_new_tokens": a.max_new_tokens,
              "timed_steps": a.steps, "threads": a.threads, "lr": a.lr, "lora_r": a.lora_r,
              "temperature": a.temperature, "task_options": a.set, "trl_version": trl.__version__,
              "transformers_version": transformers.__version__, **engines}
    if a.engine_logp:
        result["reflectrl_engine_logp_tokens_per_s"] = round(statistics.median(runs["reflectrl_engine_logp"]), 1)
    if a.shared_prompt:
        result["reflectrl_shared_prompt_tokens_per_s"] = round(statistics.median(runs["reflectrl_shared_prompt"]), 1)
    result.update(ratio_fields(result["rounds"]))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "result.json").write_text(json.dumps(result, indent=2))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
