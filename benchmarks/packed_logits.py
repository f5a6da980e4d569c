"""What computing the logits at the response's real tokens only saves in a real-model update's training pass.

    python benchmarks/packed_logits.py --rounds 5 --json-out benchmarks/results/packed_logits.json
    python benchmarks/packed_logits.py --render packed_logits.json

SmolLM2-135M-Instruct with LoRA 16, at one thread. The batch is a micro-batch shaped like a GRPO+LoRA update's on
two-digit sums (``--rows`` rows, groups of 8 sharing a chat-length prompt, responses of 5 to 32 tokens with an
environment segment before a short last turn, as the inline self-report writes them), of random token ids: the
cost of a forward and backward does not depend on which ids they are. Per round, for each layout, one forward
(log-probs and entropy, at the sampling temperature) and backward with the logits over every response position
(``full``) and at the real tokens only (``packed``), in fresh order each round (reversed every other round); the
process CPU seconds of each. The saving is the median over rounds of packed / full within the round. The log-probs
and entropies of the two are compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import resultio
import torch

from reflectrl.llm import policy as policy_mod
from reflectrl.llm.batch import RowResult, Segment, build_batch

LAYOUTS = ("padded", "causal", "shared-prompt")


def make_batch(rows: int, seed: int, pad: int) -> Any:
    """``rows`` rows in groups of 8 with two prompt lengths, responses of 5 to 32 tokens (a policy turn, a 2-token
    environment segment, a 1-token last turn)."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(0, rows, 8):
        p = [int(x) for x in torch.randint(100, 40000, (47 + 9 * ((i // 8) % 2),), generator=g)]
        prompts += [p] * 8
    results = []
    for i, p in enumerate(prompts[:rows]):
        n = 5 + (i * 7) % 28
        t = [int(x) for x in torch.randint(100, 40000, (n,), generator=g)]
        results.append(RowResult(p, [Segment(t[:n - 3], "policy", 0, 0.0), Segment(t[n - 3:n - 1], "env", 0),
                                     Segment(t[n - 1:], "policy", 1, 0.0)], None, 0.0, False, False, []))
    return build_batch(results, [i // 8 for i in range(rows)], [], pad)


def one(pol: Any, batch: Any, layout: str, pack: bool) -> tuple[float, Any]:
    policy_mod.PACK_VOCAB = 4096 if pack else 10**9
    pol.attention = layout
    pol.model.zero_grad()
    t = time.process_time()
    out = pol.forward_batch(batch, with_entropy=True, temperature=0.6)
    out.logp.sum().backward()
    return time.process_time() - t, out


def measure(a: argparse.Namespace) -> dict[str, Any]:
    from reflectrl.llm.models import resolve_model

    torch.set_num_threads(1)
    pol = policy_mod.load_policy(resolve_model(a.model), lora_r=16)
    batch = make_batch(a.rows, a.seed, pol.pad_id)
    equal: dict[str, bool] = {}
    rounds = []
    for r in range(a.rounds + 1):  # round 0 warms the allocator up and is not counted
        rec: dict[str, Any] = {"load_before": os.getloadavg()[0], "cpu_s": {}}
        for layout in (LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]):
            arms = (False, True) if r % 2 == 0 else (True, False)
            got = {pack: one(pol, batch, layout, pack) for pack in arms}
            rec["cpu_s"][layout] = {"full": got[False][0], "packed": got[True][0]}
            f, p = got[False][1], got[True][1]
            equal[layout] = equal.get(layout, True) and bool(torch.equal(f.logp, p.logp)) and bool(
                torch.equal(f.entropy, p.entropy))
        if r:
            rounds.append(rec)
    summary = {}
    for layout in LAYOUTS:
        ratios = [x["cpu_s"][layout]["packed"] / x["cpu_s"][layout]["full"] for x in rounds]
        summary[layout] = {"ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                           "full_cpu_s": statistics.median(x["cpu_s"][layout]["full"] for x in rounds),
                           "packed_cpu_s": statistics.median(x["cpu_s"][layout]["packed"] for x in rounds),
                           "bitwise_equal": equal[layout]}
    resp = batch.response_attention
    return {"benchmark": "packed_logits", "model": a.model, "rows": a.rows, "rounds": a.rounds,
            "response_width": int(resp.shape[1]), "real_response_tokens": int(resp.sum()),
            "layouts": summary, "per_round": rounds,
            "command": f"python benchmarks/packed_logits.py --rounds {a.rounds} --rows {a.rows}"}


def render(files: list[str]) -> str:
    out = []
    for f in files:
        d = json.loads(resultio.results_file(f).read_text())
        share = d["real_response_tokens"] / (d["rows"] * d["response_width"])
        out += [f"`{d['command']}` ({d['model']}, LoRA 16, one thread; a micro-batch of {d['rows']} rows whose "
                f"responses fill {share:.0%} of their padded width; {d['rounds']} rounds)", "",
                "| layout | forward + backward, full logits (CPU s) | packed (CPU s) | packed / full (median of rounds) "
                "| range | log-probs and entropies |", "|---|---|---|---|---|---|"]
        for layout, s in d["layouts"].items():
            same = "bit for bit the same" if s["bitwise_equal"] else "differ"
            out.append(f"| {layout} | {s['full_cpu_s']:.2f} | {s['packed_cpu_s']:.2f} | {s['ratio_median']:.2f} | "
                       f"{s['ratio_range'][0]:.2f}-{s['ratio_range'][1]:.2f} | {same} |")
        out.append("")
    return "\n".join(out).rstrip()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=16, help="rows of the micro-batch (an update of 64 at grad-accum 4)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    resultio.main(ap, measure, render)
