"""The data task on the real model: a GSM-style word-problem file and a multiple-choice file, with self-reports.

    python benchmarks/data_files.py --json-out benchmarks/results/data_files.json [--limit 50]
    python benchmarks/data_files.py --render data_files.json

The two files are made by the generators of tests/tasks/test_data.py (``word_problems``: 300 rows, a short story and
a worked answer ending in ``#### N``; ``choice_rows``: 200 rows, four options and the answer as a letter, an index
or the option's text), written under ``runs/data_files/`` (not shipped). For each: ``reflectrl tasks validate data``
(the share of reference answers the checker scores 1), then SmolLM2-135M-Instruct, greedy through its chat template,
on the first ``--limit`` held-out problems with a reflection and a confidence asked after each answer
(``reflectrl llm eval smollm2-135m-instruct --task data --set path=FILE --set checker=C --split heldout
--self-report both``): accuracy and the calibration of its confidence. Each command is printed before it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import resultio
from real_model import last_json, reflectrl

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
FILES = {"word problems": ("word_problems", 300, "number"), "multiple choice": ("choice_rows", 200, "choice")}
KEYS = ("n", "accuracy", "ci", "reflection_accuracy", "reflection_missing_rate", "confidence_missing_rate", "ece",
        "brier", "auroc", "mean_confidence")


def make_file(generator: str, n: int, folder: Path) -> Path:
    """The rows of a test_data generator, written as JSON lines."""
    sys.path.insert(0, str(ROOT / "tests" / "tasks"))
    try:
        import test_data
    finally:
        sys.path.pop(0)
    rows = getattr(test_data, generator)(n)
    folder.mkdir(parents=True, exist_ok=True)
    return test_data.write_jsonl(folder / f"{generator}.jsonl", rows)


def measure(a: argparse.Namespace) -> dict:
    folder = Path(a.folder)
    out: dict = {"benchmark": "data_files", "model": MODEL, "limit": a.limit, "files": {}}
    for label, (generator, n, checker) in FILES.items():
        path = make_file(generator, n, folder)
        task = ["--task", "data", "--set", f"path={path}", "--set", f"checker={checker}"]
        valid = json.loads(reflectrl(["tasks", "validate", *task[1:], "--json"], folder / "validate.log"))
        args = ["llm", "eval", MODEL, *task, "--split", "heldout", "--limit", str(a.limit), "--self-report", "both",
                "--json", "--no-progress"]
        res = last_json(reflectrl(args, folder / "eval.log"))
        out["files"][label] = {"generator": generator, "rows": n, "checker": checker,
                               "validate": {"passed": valid["passed"], "total": valid["total"]},
                               **{k: res.get(k) for k in KEYS},
                               "command": "reflectrl " + " ".join(args).replace(str(path), path.name)}
        print(f"{label}: {out['files'][label]}", flush=True)
    return out


def _f(x: float | None, pct: bool = False) -> str:
    if x is None or x != x:
        return "–"
    return f"{100 * x:.1f}" if pct else f"{x:.3f}"


def render(paths: list[str]) -> str:
    lines = ["| file | rows | checker | references scored 1 | held-out n | accuracy % [95% CI] | reflection acc. % | "
             "confidence missing % | mean confidence | ECE | Brier | AUROC |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    commands = []
    for p in paths:
        r = json.loads(resultio.results_file(p).read_text())
        for label, f in r["files"].items():
            v = f["validate"]
            lines.append(f"| {label} | {f['rows']} | {f['checker']} | {v['passed']}/{v['total']} | {f['n']} | "
                         f"{_f(f['accuracy'], True)} [{_f(f['ci'][0], True)}, {_f(f['ci'][1], True)}] | "
                         f"{_f(f['reflection_accuracy'], True)} | {_f(f['confidence_missing_rate'], True)} | "
                         f"{_f(f['mean_confidence'])} | {_f(f['ece'])} | {_f(f['brier'])} | {_f(f['auroc'])} |")
            commands.append(f"`{f['command']}`")
    return "\n".join([*lines, "", "Commands: " + "; ".join(commands)])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=50, help="held-out problems of each file")
    ap.add_argument("--folder", default="runs/data_files", help="where the files and logs go")
    resultio.main(ap, measure, render)
