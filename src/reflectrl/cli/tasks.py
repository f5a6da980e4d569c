"""``reflectrl tasks``: list the verifiable tasks, show their problems, validate their reference solutions.

``validate`` runs every problem's demonstration (its reference solution) through the task's verifier
(for a multi-turn task, also through one episode of its environment) and exits 1 if any fails.
Bad input ends in one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from typing import Any

from ..errors import ConfigError, ReflectRLError
from ..tasks.base import SPLITS, Problem, get_task, load_tasks, parse_options, score_all, split_problems


def _task(name: str, options: dict[str, Any], workers: int | None = None):
    """Instantiate a task (``workers`` passed to tasks that take it)."""
    import inspect

    factory = load_tasks().get(name)
    if workers is not None and factory is not None and "workers" in inspect.signature(factory).parameters:
        options = {**options, "workers": workers}
    return get_task(name, **options)


SHOWN = 5
"""How many failing references ``validate`` shows with their text and score."""


def _splits(choice: str) -> tuple[str, ...]:
    return SPLITS if choice == "all" else (choice,)


def _episode_ok(task, problem: Problem) -> bool:
    """Whether the reference, played as one final turn of the task's environment, gets reward 1; a task
    with its own scripted oracle (``oracle_episode(problem) -> bool``, e.g. rag: search, read, answer)
    plays that instead."""
    oracle = getattr(task, "oracle_episode", None)
    if callable(oracle):
        return bool(oracle(problem))
    env = task.make_env()
    env.reset(problem)
    _, reward, done, info = env.step(task.demonstration(problem))
    if not done and getattr(task, "reflect", None) == "turn":
        _, reward, done, info = env.step("<reflect>solved</reflect>")
    return bool(done) and reward == 1.0 and "outcome" in info


def validate(task, splits: tuple[str, ...]) -> dict[str, Any]:
    """Per split: how many reference solutions the verifier scores 1.0 and their share, which fail (the first
    :data:`SHOWN` with their text and score), and the wall time."""
    report: dict[str, Any] = {"task": task.name, "splits": {}}
    start = time.monotonic()
    for split in splits:
        t0 = time.monotonic()
        problems = split_problems(task, split) if len(splits) > 1 else task.problems(split)
        demos = [task.demonstration(p) for p in problems]
        scores = score_all(task, problems, demos)
        failed = [p.id for p, s in zip(problems, scores) if s != 1.0]
        shown = [{"id": p.id, "reference": d[:200], "score": s} for p, d, s in zip(problems, demos, scores)
                 if s != 1.0][:SHOWN]
        if task.multi_turn:
            failed += [f"{p.id} (episode)" for p in problems if not _episode_ok(task, p)]
        passed = len(problems) - len({f.split(' ')[0] for f in failed})
        report["splits"][split] = {"passed": passed, "total": len(problems),
                                   "share": round(passed / len(problems), 4) if problems else None,
                                   "failed": failed, "failures": shown, "seconds": round(time.monotonic() - t0, 2)}
    report["passed"] = sum(s["passed"] for s in report["splits"].values())
    report["total"] = sum(s["total"] for s in report["splits"].values())
    report["seconds"] = round(time.monotonic() - start, 2)
    report["ok"] = report["passed"] == report["total"]
    return report


def _cmd_list(args: argparse.Namespace) -> int:
    tasks = load_tasks()
    rows = []
    for name in sorted(tasks):
        doc = (inspect.getdoc(tasks[name]) or "").splitlines()
        row: dict[str, Any] = {"name": name, "multi_turn": bool(getattr(tasks[name], "multi_turn", False)),
                               "description": doc[0] if doc else ""}
        try:
            task = get_task(name)
            row.update({split: len(split_problems(task, split)) for split in SPLITS})
        except ReflectRLError as exc:
            row["unavailable"] = str(exc)
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        counts = (f"train {row['train']}, validation {row['validation']}, heldout {row['heldout']}" if "train" in row
                  else f"unavailable: {row['unavailable']}")
        kind = "multi-turn" if row["multi_turn"] else "single-turn"
        print(f"{row['name']:<10} {kind:<11} {counts:<26} {row['description']}")
    return 0


def task_info(name: str, task: Any, options: dict[str, Any] | None = None) -> list[str]:
    """The lines ``tasks show`` opens with: the options (``--set KEY=VALUE``), each with its value in ``options`` (the
    parsed ``--set`` values) or else its default, the token budgets of a turn (raw prompts; chat models), the turns
    and the stop sequences."""
    factory = load_tasks()[name]
    try:
        params = [p for p in inspect.signature(factory).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
                  or p.kind is p.KEYWORD_ONLY]
    except (TypeError, ValueError):
        params = []
    given = options or {}
    opts = ", ".join(f"{p.name}={given[p.name]!r}" if p.name in given else
                     f"{p.name}={p.default!r}" if p.default is not p.empty else p.name for p in params
                     if p.name != "workers")
    raw, chat = getattr(task, "max_new_tokens", None), getattr(task, "chat_max_new_tokens", None)
    turns = getattr(task, "max_turns", 1) if getattr(task, "multi_turn", False) else 1
    return [f"task {name}: {'multi-turn, up to ' + str(turns) + ' agent turns' if turns > 1 else 'single-turn'}",
            f"options (--set KEY=VALUE): {opts or 'none'}",
            f"tokens per turn (--max-new-tokens default): {raw if raw is not None else 32} with raw prompts, "
            f"{chat if chat is not None else (raw if raw is not None else 32)} with a chat model",
            f"stop sequences: {list(getattr(task, 'stop_sequences', ()) or ())}"]


def _cmd_show(args: argparse.Namespace) -> int:
    options = parse_options(args.set)
    task = _task(args.name, options)
    if not args.json:
        print("\n".join(task_info(args.name, task, options)))
    for problem in task.problems(args.split)[: args.n]:
        if args.json:
            print(json.dumps({"id": problem.id, "prompt": problem.prompt, "demonstration": task.demonstration(problem),
                              "meta": problem.meta}, default=str))
        else:
            print(f"--- {problem.id}\n{problem.prompt}", end="" if problem.prompt.endswith("\n") else "\n")
            demo = task.demonstration(problem)
            print(f">>> {demo}", end="" if demo.endswith("\n") else "\n")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    task = _task(args.name, parse_options(args.set), args.workers)
    report = validate(task, _splits(args.split))
    if args.json:
        print(json.dumps(report))
    else:
        for split, res in report["splits"].items():
            share = f"{100 * res['passed'] / res['total']:.1f}%, " if res["total"] else ""
            print(f"{report['task']} {split}: {res['passed']}/{res['total']} reference solutions pass "
                  f"({share}{res['seconds']:.1f} s)")
            scored = {f["id"]: f for f in res["failures"]}
            for pid in res["failed"][:20]:
                f = scored.get(pid)
                print(f"  FAIL {pid}" + (f": the checker scores its reference {f['reference'][:80]!r} {f['score']:g}"
                                         if f else ""))
            if len(res["failed"]) > 20:
                print(f"  ... {len(res['failed']) - 20} more")
        print(f"{report['task']}: {report['passed']}/{report['total']} pass in {report['seconds']:.1f} s")
    return 0 if report["ok"] else 1


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reflectrl tasks", description="Verifiable tasks: list, show, validate.")
    sub = ap.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="the registered tasks and their split sizes")
    lst.add_argument("--json", action="store_true", help="print one JSON list")
    for name, helptext in (("validate", "run every reference solution through the verifier; exit 1 if any fails"),
                           ("show", "print the task's options, token budgets and a few problems with their "
                                    "demonstrations")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("name", help="task name (see `reflectrl tasks list`)")
        cmd.add_argument("--split", choices=(*SPLITS, "all") if name == "validate" else SPLITS,
                         default="all" if name == "validate" else "train")
        cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="task option, e.g. --set digits=3 (VALUE is JSON or text); repeatable")
        cmd.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "validate":
            cmd.add_argument("--workers", type=int, default=None, help="parallel sandbox runs (default: CPU count)")
        else:
            cmd.add_argument("-n", type=int, default=3, help="how many problems (default 3)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``reflectrl tasks``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage / help
        return int(exc.code or 0)
    try:
        if args.command == "validate" and args.workers is not None and args.workers < 1:
            raise ConfigError("--workers must be at least 1")
        if args.command == "show" and args.n < 1:
            raise ConfigError(f"-n must be at least 1, got {args.n}")
        return {"list": _cmd_list, "show": _cmd_show, "validate": _cmd_validate}[args.command](args)
    except ReflectRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
