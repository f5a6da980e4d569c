"""Where a model fails on ``rag``'s generated knowledge base: which fact it never retrieved, or what it answered
after retrieving every fact, and how often it answers each kind of question (city, name, year).

    python benchmarks/rag_failures.py runs/learn/rag_s1/warmup runs/learn/rag_s1/grpo ... \
        --limit 400 --json-out benchmarks/results/rag_failures.json
    python benchmarks/rag_failures.py --render rag_failures.json    # markdown (BENCHMARKS.md)

Each folder is a model directory or an LLM run directory (``reflectrl llm eval`` takes either), evaluated on the
first ``--limit`` held-out questions with the recipe's task options (``n_companies=1000``): greedy, as the learning
bar measures, and ``--samples`` completions each at temperature 1 (the policy GRPO samples; pass@1 and
pass@``samples``). A greedy episode that is wrong falls in the first of these that holds:

- *no answer*: the episode ended without an ``<answer>`` (an invalid turn or the turn limit);
- *missed fact 1*: no search returned the passage of the first hop's fact (the subject's name miscopied into
  the query, or the wrong relation asked);
- *missed fact 2*: a two-hop question whose second fact no search returned (the bridge entity miscopied out of
  the first results);
- *found, wrong answer*: every fact was retrieved and the answer is still wrong (miscopied out of the results).

A search's results are found again with the task's own index (retrieval is deterministic).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
OPTIONS = ("n_companies=1000",)
KINDS = {"city": ("p_city", "c_city", "p_employer_city", "c_founder_city"), "name": ("p_employer", "c_founder"),
         "year": ("p_born", "c_year", "p_employer_year", "c_founder_born")}
CATEGORIES = ("no answer", "missed fact 1", "missed fact 2", "found, wrong answer")


def category(task, problem, infos: list[dict]) -> str:
    """The failure category of a wrong greedy episode (see the module docstring)."""
    if not infos or infos[-1].get("kind") != "answer":
        return "no answer"
    ids = set()
    for info in infos:
        if info.get("kind") == "search":
            ids |= {p.id for p in task.index().search(info["query"], task.k)}
    for hop, pid in enumerate(problem.meta["support"]):
        if pid not in ids:
            return f"missed fact {hop + 1}"
    return "found, wrong answer"


def measure(path: str, limit: int, samples: int) -> dict:
    from reflectrl.llm.evaluate import evaluate
    from reflectrl.tasks.base import get_task, parse_options

    task = get_task("rag", **parse_options(OPTIONS))
    problems = {p.id: p for p in task.problems("heldout")[:limit]}
    greedy = evaluate(path, task="rag", task_options=OPTIONS, limit=limit, transcripts=True, max_new_tokens=64)
    counts = dict.fromkeys(CATEGORIES, 0)
    kinds = {k: [0, 0] for k in KINDS}
    for ep in greedy["episodes"]:
        p = problems[ep["problem"]]
        kind = next(k for k, names in KINDS.items() if p.meta["template"] in names)
        kinds[kind][0] += int(ep["correct"])
        kinds[kind][1] += 1
        if not ep["correct"]:
            counts[category(task, p, ep["infos"])] += 1
    sampled = evaluate(path, task="rag", task_options=OPTIONS, limit=limit, samples=samples, temperature=1.0,
                       max_new_tokens=64)
    n = greedy["n"]
    return {"model": path, "n": n, "greedy": greedy["accuracy"], "sampled": sampled["accuracy"],
            f"pass@{samples}": sampled[f"pass@{samples}"], "samples": samples,
            "failures": {k: v / n for k, v in counts.items()},
            "by_kind": {k: (c / t if t else None) for k, (c, t) in kinds.items()}}


def render(name: str) -> str:
    data = json.loads((RES / name).read_text())
    rows = data["models"]
    k = rows[0]["samples"]
    head = ["model", "greedy", "sampled", f"pass@{k}", *CATEGORIES, *(f"{kind} questions" for kind in KINDS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    for r in rows:
        cells = [f"`{r['model']}`", pct(r["greedy"]), pct(r["sampled"]), pct(r[f"pass@{k}"]),
                 *(pct(r["failures"][c]) for c in CATEGORIES), *(pct(r["by_kind"][kind]) for kind in KINDS)]
        lines.append("| " + " | ".join(cells) + " |")
    n = rows[0]["n"]
    lines.append("")
    lines.append(f"The first {n} held-out questions. Greedy and sampled (temperature 1, {k} per question) accuracy, "
                 f"pass@{k}; each failure column is a share of all {n} greedy episodes; the last three are the greedy "
                 "accuracy on the questions whose answer is a city, a person's or company's name, or a year.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="model or LLM run directories")
    ap.add_argument("--limit", type=int, default=400, help="held-out questions (the first N)")
    ap.add_argument("--samples", type=int, default=8, help="sampled completions per question (pass@k)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--render", metavar="NAME", help="print the markdown table of benchmarks/results/NAME")
    a = ap.parse_args()
    if a.render:
        print(render(a.render))
        return
    if not a.models:
        ap.error("give model directories, or --render NAME")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for m in a.models:
        rows.append(measure(m, a.limit, a.samples))
        print(json.dumps(rows[-1]), flush=True)
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"benchmark": "rag_failures", "limit": a.limit, "models": rows},
                                               indent=1) + "\n")


if __name__ == "__main__":
    main()
