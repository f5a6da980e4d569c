"""Where a rag episode goes wrong: the search query, the retrieval, or the reading of what was retrieved.

    python benchmarks/rag_reading.py runs/bench/llm_learn/rag_s1 runs/bench/llm_learn/rag_s2 \
        runs/bench/llm_learn/rag_s3 --limit 200 --json-out benchmarks/results/rag_reading.json
    python benchmarks/rag_reading.py --render rag_reading.json    # markdown (BENCHMARKS.md)

For each ``benchmarks/llm_learn.py --task rag`` output folder, the warmed-up model (``DIR/warmup``) and the
model after GRPO (``DIR/grpo``) play the first ``--limit`` held-out problems greedily, as ``reflectrl llm eval``
plays them (``evaluate_policy``, with the recipe's task options), and each episode is split into its stages,
read from the environment's per-step records and the transcript:

- ``query_names_entity``: the first search names the question's entity exactly (a whole word of the query);
  the oracle's first query is the entity and the relation;
- ``gold_retrieved``: for a one-hop question, the reference answer is a word of what the first search
  returned (retrieval put the fact in the context);
- right when retrieved: among those one-hop episodes, the share answered right (the model read the fact it had);
- ``answer_in_context``: among answered episodes, the share whose answer is a word of the retrieved text
  (copied from the context rather than produced from memory);
- accuracy, overall and among episodes whose first query names the entity.

The entity of a question and its hops are the problem's ``meta`` (``entity``, ``hops``), as the generated
knowledge base writes them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RES = Path(__file__).resolve().parent / "results"
MODELS = ("warmup", "grpo")
WORD = re.compile(r"[A-Za-z0-9]+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text))


def episode_stages(problem: Any, infos: list[dict], transcript: list[tuple[str, str]], correct: bool) -> dict:
    """The stage flags of one episode (see the module docstring); None where a flag does not apply."""
    entity, hops = str(problem.meta.get("entity", "")), int(problem.meta.get("hops", 1))
    searches = [i for i in infos if i.get("kind") == "search"]
    replies = [text for kind, text in transcript if kind == "env"]
    first_reply = replies[0] if searches and replies else ""
    final = infos[-1] if infos else {}
    answer = str(final.get("answer", "")) if final.get("answered") else None
    names = bool(searches) and entity in words(str(searches[0].get("query", "")))
    gold_words = words(str(problem.answer))
    gold = bool(gold_words) and gold_words <= words(first_reply) if hops == 1 and searches else None
    said = words(answer) if answer is not None else set()
    return {"correct": bool(correct), "searched": bool(searches), "query_names_entity": names, "gold_retrieved": gold,
            "answered": answer is not None,
            "answer_in_context": None if answer is None else bool(said) and said <= words(" ".join(replies))}


def share(rows: list[dict], key: str, where: str | None = None) -> tuple[float | None, int]:
    pool = [r for r in rows if (where is None or r[where]) and r[key] is not None]
    return (sum(bool(r[key]) for r in pool) / len(pool) if pool else None), len(pool)


def measure_model(model: Path, limit: int) -> dict:
    import torch

    from reflectrl.experiments.recipes import recipe
    from reflectrl.llm.evaluate import evaluate_policy, load_for_eval
    from reflectrl.tasks.base import get_task, parse_options

    torch.set_num_threads(1)
    policy, _ = load_for_eval(model)
    task = get_task("rag", **parse_options(list(recipe("rag").task_options)))
    by_id = {p.id: p for p in task.problems("heldout")}
    ev = evaluate_policy(policy, task, "heldout", max_new_tokens=int(getattr(task, "max_new_tokens", 64)),
                         limit=limit, transcripts=True)
    rows = [episode_stages(by_id[e["problem"]], e["infos"], e["transcript"], e["correct"]) for e in ev["episodes"]]
    out: dict[str, Any] = {"n": len(rows)}
    for key, where in (("correct", None), ("query_names_entity", "searched"), ("gold_retrieved", None),
                       ("correct", "gold_retrieved"), ("answer_in_context", "answered"), ("correct", "query_names_entity")):
        value, n = share(rows, key, where)
        out[key if where is None else f"{key}|{where}"] = {"share": value, "n": n}
    out["searched"] = share(rows, "searched")[0]
    return out


def measure(dirs: list[Path], limit: int) -> dict:
    runs = []
    for d in dirs:
        seed = json.loads((d / "result.json").read_text())["seed"] if (d / "result.json").is_file() else None
        for m in MODELS:
            if (d / m).exists():
                print(f"{d}/{m}", file=sys.stderr, flush=True)
                runs.append({"dir": str(d), "seed": seed, "model": m, **measure_model(d / m, limit)})
    return {"benchmark": "rag_reading", "limit": limit, "runs": runs}


COLUMNS = (("correct", "accuracy"), ("query_names_entity|searched", "first query names the entity"),
           ("gold_retrieved", "one-hop: fact retrieved"), ("correct|gold_retrieved", "one-hop: right when retrieved"),
           ("answer_in_context|answered", "answer copied from the context"),
           ("correct|query_names_entity", "accuracy when the query names the entity"))


def render(path: Path) -> str:
    r = json.loads(path.read_text())
    head = "| folder | seed | model | " + " | ".join(c for _, c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for run in r["runs"]:
        cells = []
        for key, _ in COLUMNS:
            v = run[key]
            cells.append("n/a" if v["share"] is None else f"{100 * v['share']:.1f}% (n={v['n']})")
        lines.append(f"| {Path(run['dir']).name} | {run['seed']} | {run['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="benchmarks/llm_learn.py --task rag output folders")
    ap.add_argument("--limit", type=int, default=200, help="held-out problems per model")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--render", default=None, metavar="FILE", help="print the markdown table of a results file")
    a = ap.parse_args()
    if a.render:
        print(render(RES / a.render if not Path(a.render).is_file() else Path(a.render)))
        return
    if not a.dirs:
        ap.error("give llm_learn output folders, or --render FILE")
    r = measure(a.dirs, a.limit)
    if a.json_out:
        a.json_out.write_text(json.dumps(r, indent=2))
    print(render(a.json_out) if a.json_out else json.dumps(r))


if __name__ == "__main__":
    main()
