"""How close a real-model update comes to what this CPU can do at all: each phase's share of the float32 matmul peak.

    python benchmarks/roofline.py [--rounds 3] [--threads 1 2] [--json-out F]
    python benchmarks/roofline.py --render F

The peak is measured, not quoted: float32 products at the model's own shapes (``F.linear``, as the model calls them:
the issue's 512x576x1536, the projections of a decoding step over 64 rows, of a training micro-batch of 1024 tokens,
and the output layer over the vocabulary), each timed for at least ``--min-cpu-s`` of process CPU time; the peak of
a thread count is the fastest of them, the most any implementation of these products reached here. The update is
GRPO with LoRA (rank 16) on SmolLM2-135M-Instruct at the defaults of ``llm train --recipe real-arith`` (8 prompts x 8
samples of two-digit sums, 4 micro-batches), trained on from the base model. Its phases are timed on the process CPU
clock around the trainer's own calls (the sampler's prefill and sampling loop, the training forward of each
micro-batch, the whole update and the optimizer step in it): the training backward is the update less its forwards
and its optimizer steps. Each phase's useful floating-point work is counted from the tokens it ran, padding
excluded: the prefill of each distinct prompt, one decoding step per sampled token after the first (over its context
so far), and the training forward over the micro-batch's distinct prompts once and its distinct rows' responses,
the logits at the response tokens only (what the trainer computes); the LoRA backward is the forward's products
again for the gradients of the activations (the frozen weights need none of their own), the attention's twice, and
the adapters' weight gradients; AdamW is 12 operations per trainable parameter. A phase's share of the peak is its
useful work per CPU second over the peak's products per CPU second at the same thread count.

The machine this runs on may be shared: every rate is per second of this process's CPU time (all its threads), so
that time the process waits for a core counts for neither, and the peak and the update are measured in the same
process, interleaved: each round measures the peak, then times one update, at each thread count in turn (the order
alternating between rounds). The medians over rounds are reported. At two threads a CPU second is a core's: the
share is of two cores' peak, each second of either counted. On a machine loaded past its cores, two threads measure
their waiting more than their work (one spins while the other has lost its core): measure them on an idle one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resultio import main as run  # noqa: E402
from resultio import results_file  # noqa: E402

PHASES = ("prefill", "decode", "train_forward", "train_backward", "optimizer")
LABEL = {"prefill": "prefill (sampler)", "decode": "decoding steps (sampler)", "train_forward": "training forward",
         "train_backward": "training backward", "optimizer": "optimizer step (AdamW)",
         "train": "training forward + backward"}


def shapes(width: int, inner: int, kv: int, vocab: int) -> dict[str, tuple[int, int, int]]:
    """Named products ``rows x in -> out`` at the model's shapes."""
    return {"512x576x1536": (512, 576, 1536),
            "decode 64 rows: q/o": (64, width, width), "decode 64 rows: k/v": (64, width, kv),
            "decode 64 rows: gate/up": (64, width, inner), "decode 64 rows: down": (64, inner, width),
            "decode 64 rows: output layer": (64, width, vocab),
            "train 1024 tokens: q/o": (1024, width, width), "train 1024 tokens: k/v": (1024, width, kv),
            "train 1024 tokens: gate/up": (1024, width, inner), "train 1024 tokens: down": (1024, inner, width),
            "train 256 tokens: output layer": (256, width, vocab)}


def matmul_rates(named: dict[str, tuple[int, int, int]], min_cpu_s: float) -> dict[str, float]:
    """GFLOP per CPU second of each product at the current thread count (float32, ``F.linear``)."""
    import torch
    import torch.nn.functional as F

    out = {}
    g = torch.Generator().manual_seed(0)
    for name, (m, k, n) in named.items():
        x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        for _ in range(3):
            F.linear(x, w)
        reps, t0 = 0, time.process_time()
        while True:
            F.linear(x, w)
            reps += 1
            spent = time.process_time() - t0
            if spent >= min_cpu_s and reps >= 5:
                break
        out[name] = 2 * m * k * n * reps / spent / 1e9
    return out


class Flops:
    """Useful floating-point operations of a Llama-architecture model (attention and MLP products, the output layer
    where logits are computed, LoRA adapters on every linear layer)."""

    def __init__(self, config: Any, lora_r: int):
        self.L, d, inner = config.num_hidden_layers, config.hidden_size, config.intermediate_size
        kv = config.num_key_value_heads * (d // config.num_attention_heads)
        self.d, self.vocab = d, config.vocab_size
        shapes_ = [(d, d), (d, kv), (d, kv), (d, d), (d, inner), (d, inner), (inner, d)]
        self.linear = 2 * self.L * sum(i * o for i, o in shapes_)  # per token, the base weights
        self.lora = 2 * self.L * sum(lora_r * (i + o) for i, o in shapes_)  # per token, the adapters
        self.head = 2 * d * self.vocab  # per token whose logits are computed
        self.lora_params = self.L * sum(lora_r * (i + o) for i, o in shapes_)

    def attention(self, start: int, n: int) -> int:
        """Scores and weighted values of ``n`` tokens at positions ``start..start+n-1`` (each over itself and before)."""
        keys = n * start + n * (n + 1) // 2
        return 4 * self.d * self.L * keys

    def tokens(self, start: int, n: int, logits: int) -> int:
        """Forward work of ``n`` tokens after ``start`` of context, with logits at ``logits`` of them."""
        return n * (self.linear + self.lora) + self.attention(start, n) + logits * self.head

    def backward(self, start: int, n: int, logits: int) -> int:
        """LoRA backward of those tokens: activation gradients through every product (the attention's two operands
        each), the adapters' weight gradients."""
        return n * (self.linear + 2 * self.lora) + 2 * self.attention(start, n) + logits * self.head


def instrument(trainer: Any, flops: Flops) -> tuple[dict[str, float], dict[str, float], Callable[[], None]]:
    """Wrap the trainer's phases with CPU timers and work counters; returns (CPU s, FLOPs, reset)."""
    cpu: dict[str, float] = {}
    work: dict[str, float] = {}
    eng = trainer.engine

    def add(d: dict[str, float], k: str, v: float) -> None:
        d[k] = d.get(k, 0.0) + v

    def timed(name: str, fn: Callable[..., Any], count: Callable[..., None] | None = None) -> Callable[..., Any]:
        def wrapped(*a: Any, **k: Any) -> Any:
            t0 = time.process_time()
            out = fn(*a, **k)
            add(cpu, name, time.process_time() - t0)
            if count is not None:
                count(out, *a, **k)
            return out
        return wrapped

    def count_prefill(out: Any, prompts: Any) -> None:
        for p in {tuple(p) for p in prompts}:
            add(work, "prefill", flops.tokens(0, len(p), 1))

    def count_decode(out: Any, prompts: Any, *a: Any, **k: Any) -> None:
        ids, _ = out
        for p, row in zip(prompts, ids):
            if len(row) > 1:  # the first token is drawn from the prefill's logits
                add(work, "decode", flops.tokens(len(p), len(row) - 1, len(row) - 1))

    def count_forward(out: Any, mb: Any, counts: Any = None) -> None:
        prompts = mb.prompt_tokens()
        resp = mb.response_attention.sum(1).tolist()
        for p in {tuple(p) for p in prompts}:
            add(work, "train_forward", flops.tokens(0, len(p), 0))
            add(work, "train_backward", flops.backward(0, len(p), 0))
        for p, r in zip(prompts, resp):
            add(work, "train_forward", flops.tokens(len(p), int(r), int(r)))
            add(work, "train_backward", flops.backward(len(p), int(r), int(r)))
        add(work, "train_rows", mb.rows)
        add(work, "train_tokens", sum(resp) + sum(len(p) for p in {tuple(p) for p in prompts}))

    def count_step(out: Any, *a: Any, **k: Any) -> None:
        add(work, "optimizer", 12 * flops.lora_params)

    eng._start = timed("prefill", eng._start, count_prefill)
    eng._sample = timed("generate", eng._sample, count_decode)
    trainer.micro_loss = timed("train_forward", trainer.micro_loss, count_forward)
    trainer.update = timed("update", trainer.update)
    trainer.optimizer.step = timed("optimizer", trainer.optimizer.step, count_step)

    def reset() -> None:
        cpu.clear()
        work.clear()
    return cpu, work, reset


def one_update(trainer: Any, cpu: dict[str, float], work: dict[str, float], reset: Callable[[], None]
               ) -> dict[str, Any]:
    """One update's CPU seconds and useful GFLOP per phase."""
    reset()
    t0 = time.process_time()
    rec = trainer.iteration()
    whole = time.process_time() - t0
    secs = {"prefill": cpu.get("prefill", 0.0), "decode": cpu.get("generate", 0.0) - cpu.get("prefill", 0.0),
            "train_forward": cpu.get("train_forward", 0.0), "optimizer": cpu.get("optimizer", 0.0)}
    secs["train_backward"] = cpu.get("update", 0.0) - secs["train_forward"] - secs["optimizer"]
    return {"cpu_s": secs, "gflop": {k: work.get(k, 0.0) / 1e9 for k in PHASES}, "iteration_cpu_s": whole,
            "train_rows": work.get("train_rows", 0), "train_tokens": work.get("train_tokens", 0),
            "generated_tokens": rec.get("rollout/generated_tokens"), "reward": rec.get("reward/mean")}


def measure(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.cli.util import config_from_flags
    from reflectrl.experiments.recipes import train_recipe
    from reflectrl.llm.grpo import GRPO

    recipe = train_recipe("real-arith")
    tmp = tempfile.mkdtemp(prefix="roofline-")
    flags = [*recipe.flags, "--updates", str(len(a.threads) * a.rounds + 1), "--run-dir", f"{tmp}/run",
             "--no-progress", "--no-tensorboard", "--no-export-model", "--sample-interval", "0",
             "--cpu-time-limit-s", "1e9", "--seed", str(a.seed)]
    from reflectrl.algos import config_for_algo

    default = config_for_algo(recipe.algo, model=recipe.model, lora_r=16, task=recipe.task,
                              task_options=recipe.task_options)
    cfg = config_from_flags(default, flags, "roofline", "llm", False)
    trainer = GRPO(cfg)
    conf = trainer.policy.model.config
    flops = Flops(conf, cfg.lora_r)
    named = shapes(conf.hidden_size, conf.intermediate_size,
                   conf.num_key_value_heads * (conf.hidden_size // conf.num_attention_heads), conf.vocab_size)
    cpu, work, reset = instrument(trainer, flops)
    per: dict[int, dict[str, list[Any]]] = {t: {"peak": [], "rates": [], "updates": []} for t in a.threads}
    for r in range(a.rounds):
        for t in (a.threads if r % 2 == 0 else a.threads[::-1]):
            torch.set_num_threads(t)
            rates = matmul_rates(named, a.min_cpu_s)
            per[t]["rates"].append(rates)
            per[t]["peak"].append(max(rates.values()))
            per[t]["updates"].append(one_update(trainer, cpu, work, reset))
            print(f"round {r + 1} threads {t}: peak {max(rates.values()):.1f} GFLOP/s per CPU s, update "
                  f"{per[t]['updates'][-1]['iteration_cpu_s']:.1f} CPU s", file=sys.stderr, flush=True)
    trainer.close()
    out: dict[str, Any] = {"model": recipe.model, "recipe": recipe.name, "flags": flags[:flags.index("--run-dir")],
                           "attention": trainer.cfg.attention, "old_logp": trainer.cfg.old_logp,
                           "rounds": a.rounds, "torch": torch.__version__, "threads": {}}
    for t in a.threads:
        ups = per[t]["updates"]
        rows = []
        for u, peak in zip(ups, per[t]["peak"]):
            row = {k: u["gflop"][k] / max(u["cpu_s"][k], 1e-9) / peak for k in PHASES}
            train_s = u["cpu_s"]["train_forward"] + u["cpu_s"]["train_backward"]
            row["train"] = (u["gflop"]["train_forward"] + u["gflop"]["train_backward"]) / max(train_s, 1e-9) / peak
            rows.append(row)
        med = lambda xs: statistics.median(xs)
        out["threads"][str(t)] = {
            "peak_gflops": med(per[t]["peak"]),
            "rates_gflops": {n: med([r[n] for r in per[t]["rates"]]) for n in named},
            "cpu_s": {k: med([u["cpu_s"][k] for u in ups]) for k in PHASES},
            "gflop": {k: med([u["gflop"][k] for u in ups]) for k in PHASES},
            "iteration_cpu_s": med([u["iteration_cpu_s"] for u in ups]),
            "share_of_peak": {k: med([r[k] for r in rows]) for k in (*PHASES, "train")},
            "train_rows": med([u["train_rows"] for u in ups]), "train_tokens": med([u["train_tokens"] for u in ups]),
            "generated_tokens": med([u["generated_tokens"] or 0 for u in ups]),
            "per_round": ups}
    return out


def render(names: list[str]) -> str:
    r = json.loads(results_file(names[0]).read_text())
    ts = list(r["threads"])
    head = " | ".join(f"{t} thread{'s' if t != '1' else ''}" for t in ts)
    lines = [f"| float32 product (rows x in -> out) | GFLOP per CPU s, {head} |", "|---|" + "---|" * len(ts)]
    for n in r["threads"][ts[0]]["rates_gflops"]:
        lines.append(f"| {n} | " + " | ".join(f"{r['threads'][t]['rates_gflops'][n]:.1f}" for t in ts) + " |")
    lines.append("| **peak (the fastest)** | " + " | ".join(f"**{r['threads'][t]['peak_gflops']:.1f}**" for t in ts)
                 + " |")
    lines += ["", "| threads | phase | useful GFLOP | CPU s | share of the update's CPU | GFLOP per CPU s | "
                  "share of the peak |", "|---|---|---|---|---|---|---|"]
    for t in ts:
        x = r["threads"][t]
        ups = x["per_round"]
        for k in (*PHASES, "train"):
            parts = ("train_forward", "train_backward") if k == "train" else (k,)
            g = statistics.median(sum(u["gflop"][p] for p in parts) for u in ups)
            s = statistics.median(sum(u["cpu_s"][p] for p in parts) for u in ups)
            of = statistics.median(sum(u["cpu_s"][p] for p in parts) / u["iteration_cpu_s"] for u in ups)
            lines.append(f"| {t} | {LABEL[k]} | {g:.1f} | {s:.2f} | {of:.0%} | {g / max(s, 1e-9):.1f} | "
                         f"{x['share_of_peak'][k]:.0%} |")
        rest = [u["iteration_cpu_s"] - sum(u["cpu_s"][p] for p in PHASES) for u in ups]
        of = statistics.median(v / u["iteration_cpu_s"] for v, u in zip(rest, ups))
        lines.append(f"| {t} | the rest (rewards, batch, advantages, logging) | | {statistics.median(rest):.2f} | "
                     f"{of:.1%} | | |")
    one = r["threads"][ts[0]]
    lines += ["", f"Medians of {r['rounds']} rounds (each column's own); an update trained {one['train_rows']:.0f} distinct rows "
                  f"({one['train_tokens']:.0f} tokens with each prompt once, padding excluded) and sampled "
                  f"{one['generated_tokens']:.0f} tokens; the whole update took {one['iteration_cpu_s']:.1f} CPU s "
                  f"at {ts[0]} thread (torch {r['torch']})."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each timing the peak and one update per thread count")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts")
    ap.add_argument("--min-cpu-s", type=float, default=0.3, help="CPU seconds each product is timed for, at least")
    ap.add_argument("--seed", type=int, default=1)
    run(ap, measure, render)


if __name__ == "__main__":
    main()
