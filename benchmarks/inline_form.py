"""The inline self-report form on the real model, as it ships: how many reports parse, and what the instruction
costs the answers.

On validation problems (greedy), per task: the plain task's accuracy; the instruction alone (the first message asks
for ``<confidence>q</confidence>`` after the answer, the model writes the rest); and the inline form as the trainer
runs it (the same instruction, then the environment opens the tag after the answer), for each wording of the
instruction tried. Validation problems only: the wording is chosen here.

    python benchmarks/inline_form.py --limit 60 --json-out benchmarks/results/inline_form.json   # ~15 CPU-minutes
    python benchmarks/inline_form.py --render inline_form.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from resultio import main, results_file

MODEL = "smollm2-135m-instruct"
WORDINGS = {  # the default (reflectrl.tasks.selfreport.INLINE_ASKS) is "tag only", chosen on validation sums
    "after your answer": "After your answer, state your confidence that it is correct as <confidence>p</confidence>, "
                         "with p between 0 and 1.",
    "chance": "Then write <confidence>p</confidence>, where p is the chance your answer is right.",
    "tag only": "Then write <confidence>p</confidence>.",
    "none": "",
}


class _Asking:
    """The task with the inline instruction in its first message, and nothing else changed (the instruction alone)."""

    def __init__(self, task: Any, ask: str):
        self.task, self.ask = task, ask

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["task"], name)

    def chat_prompt(self, problem: Any) -> str:
        from reflectrl.tasks.base import chat_prompt

        return f"{chat_prompt(self.task, problem)} {self.ask}".rstrip()


def measure(a: argparse.Namespace) -> dict[str, Any]:
    from reflectrl.llm.evaluate import evaluate_policy
    from reflectrl.llm.policy import load_policy
    from reflectrl.tasks import selfreport
    from reflectrl.tasks.base import get_task, parse_confidence, parse_options

    policy = load_policy(MODEL)
    rows = []
    for name in a.tasks:
        task = get_task(name, **parse_options(a.set))
        plain = evaluate_policy(policy, task, a.split, limit=a.limit)
        row: dict[str, Any] = {"task": name, "n": plain["n"], "plain_accuracy": plain["accuracy"], "wordings": {}}
        for label, ask in ((w, WORDINGS[w]) for w in a.wordings):
            alone = evaluate_policy(policy, _Asking(task, ask), a.split, limit=a.limit, transcripts=True)
            stated = [parse_confidence("".join(t for k, t in ep["transcript"] if k == "policy")) is not None
                      for ep in alone["episodes"]]
            saved = selfreport.INLINE_ASKS["confidence"]
            selfreport.INLINE_ASKS["confidence"] = ask
            try:
                inline = evaluate_policy(policy, task, a.split, limit=a.limit, self_report="inline")
            finally:
                selfreport.INLINE_ASKS["confidence"] = saved
            row["wordings"][label] = {
                "instruction": ask, "alone_accuracy": alone["accuracy"], "alone_parsed": sum(stated) / len(stated),
                "inline_accuracy": inline["accuracy"], "inline_parsed": 1.0 - inline["confidence_missing_rate"],
                "inline_auroc": inline.get("auroc"), "inline_mean_confidence": inline.get("mean_confidence")}
            print(json.dumps({name: row["wordings"][label]}), flush=True)
        rows.append(row)
    return {"model": MODEL, "split": a.split, "limit": a.limit, "task_options": a.set, "rows": rows}


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def render(files: list[str]) -> str:
    lines = []
    for f in files:
        res = json.loads(results_file(f).read_text())
        opts = f" ({', '.join(res['task_options'])})" if res.get("task_options") else ""
        lines += [f"{res['model']}, greedy, the first {res['limit']} {res['split']} problems of each task{opts}: the share of "
                  "answers whose confidence parses and the accuracy, for the instruction alone and for the inline form "
                  "(the instruction, then the tag opened after the answer).", "",
                  "| task | wording | plain accuracy | instruction alone: parsed | accuracy | inline form: parsed | "
                  "accuracy | AUROC | mean confidence |", "|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            for label, w in r["wordings"].items():
                lines.append(f"| {r['task']} | {label} | {_f(r['plain_accuracy'])} | {_f(w['alone_parsed'])} | "
                             f"{_f(w['alone_accuracy'])} | {_f(w['inline_parsed'])} | {_f(w['inline_accuracy'])} | "
                             f"{_f(w['inline_auroc'])} | {_f(w['inline_mean_confidence'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["arith", "text2sql"])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task option (e.g. ops=+)")
    ap.add_argument("--wordings", nargs="+", default=list(WORDINGS), choices=list(WORDINGS))
    ap.add_argument("--split", default="validation", choices=("validation", "heldout"),
                    help="validation chooses the wording; heldout checks the chosen one once")
    ap.add_argument("--limit", type=int, default=60, help="validation problems per task")
    main(ap, measure, render)
