"""``reflectrl llm compare``: LLM methods x tasks x seeds, each run through the CLI, then ``report.md`` (held-out
accuracy and calibration with bootstrap CIs), ``curves.png`` and reliability diagrams.

Without ``--model``, each (task, seed) gets one tiny model built by the task's CPU recipe
(:mod:`reflectrl.experiments.recipes`: init-tiny, then a warm-up to a weak-but-nonzero accuracy whose
demonstrations end with self-reports, a quarter of them after the teacher prompt that gear uses) in
``OUT/models/{task}/seed_{s}/warmup``, and every method of that
seed trains from it: the comparison is paired. Runs live in ``OUT/runs/{task}/{method}/seed_{s}/`` and go
through the same :func:`~reflectrl.experiments.runner.run_one` as ``reflectrl compare`` (skip finished, resume
interrupted, retry, local pool or Ray); each is evaluated greedily on the held-out split with a reflection
and a confidence asked after each answer (``reflectrl llm eval --self-report both``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ReflectRLError
from ..runlog import guard_folder
from .compare import MethodSpec, check_grid_args, check_train_args
from .runner import RunSpec, _run_cli, make_result, materialize, plan, run_local

if TYPE_CHECKING:
    from .recipes import Recipe


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="reflectrl llm compare",
        description="Train and evaluate LLM methods x tasks x seeds (runs in OUT/runs/{task}/{method}/seed_{s}), then "
                    "write OUT/report.md, OUT/curves.png and reliability diagrams. Rerunning the same command skips "
                    "finished runs and resumes interrupted ones.")
    ap.add_argument("--methods", nargs="+", required=True, metavar="METHOD",
                    help="`reflectrl llm train --algo` names, or variants 'LABEL=ALGO TRAIN FLAGS' (quoted); the first "
                         "is the baseline of the probability of improvement")
    ap.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help="registered tasks (arith, text2sql, ...)")
    ap.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds 1..N per method and task (default 5)")
    ap.add_argument("--updates", type=int, default=None, metavar="U",
                    help="updates per run (default: the task recipe's budget)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder (models/, runs/, report.md, ...)")
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="the model every run starts from: a folder, a named model or a .gguf file (default: one tiny "
                         "model per task and seed, built by the task's recipe)")
    ap.add_argument("--warmup-target", type=float, default=None, metavar="F",
                    help="train accuracy at which each tiny model's warm-up stops (default: the task recipe's, 0.2); a "
                         "lower one gives a harder setting, GRPO starting from a weaker model (use its own --out)")
    ap.add_argument("--task-option", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a task option added to the recipe's, in every warm-up, run and evaluation (repeatable): "
                         "--task-option report=steps")
    ap.add_argument("--step-confidence", action="store_true",
                    help="the warm-ups' demonstrations state a confidence on every turn (`reflectrl llm warmup "
                         "--step-confidence`; rag with --task-option report=steps)")
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="local: a pool of processes on this machine; ray: one Ray task per run")
    ap.add_argument("--workers", type=int, default=2, metavar="K", help="runs (and model builds) at a time")
    ap.add_argument("--retries", type=int, default=0, metavar="N", help="attempts after a failed one (default 0)")
    ap.add_argument("--self-report", choices=("reflect", "confidence", "both", "off"), default="both",
                    help="what the evaluation asks after each held-out answer (default both)")
    ap.add_argument("--eval-limit", type=int, default=None, metavar="N", help="held-out problems per evaluation")
    ap.add_argument("--early-fraction", type=float, default=0.2, metavar="F",
                    help="share of the updates the early-learning AUC covers (default 0.2)")
    ap.add_argument("--bootstrap-reps", type=int, default=5000, metavar="N", help="bootstrap resamples per CI")
    ap.add_argument("--report-only", action="store_true", help="train nothing: report the runs finished so far")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], metavar="TRAIN FLAGS",
                    help="flags passed to every `reflectrl llm train` (must come last)")
    return ap


def _validate(args: argparse.Namespace) -> list[MethodSpec]:
    from ..tasks.base import get_task

    methods = check_grid_args(args, "llm", [(args.updates is None or args.updates >= 1, "--updates must be at least 1"),
                                            (args.eval_limit is None or args.eval_limit >= 1,
                                             "--eval-limit must be at least 1"),
                                            (args.warmup_target is None or 0.0 < args.warmup_target <= 1.0,
                                             "--warmup-target must be in (0, 1]"),
                                            (args.warmup_target is None or args.model is None,
                                             "--warmup-target sets how the tiny models are built: not with --model"),
                                            (not args.step_confidence or args.model is None,
                                             "--step-confidence sets how the tiny models are built: not with --model")])
    from ..tasks.base import parse_options

    parse_options(args.task_option)  # one clear error for a malformed KEY=VALUE
    for task in args.tasks:
        get_task(task, **parse_options(args.task_option))
        if args.model is None:
            from .recipes import recipe

            recipe(task)
    if args.model is not None:
        from ..llm.models import NAMED_MODELS, is_gguf

        if not (Path(args.model).is_dir() or args.model in NAMED_MODELS or is_gguf(args.model)):
            raise ConfigError(f"--model {args.model} is not a model directory, a named model "
                              f"({', '.join(NAMED_MODELS)}) or a .gguf file")
    return methods


def model_dir(out: Path, task: str, seed: int) -> Path:
    return Path(out) / "models" / task / f"seed_{seed}"


def task_recipe(task: str, task_options: Sequence[str] = ()) -> Recipe:
    """The task's CPU recipe with ``task_options`` (KEY=VALUE) added to its own."""
    from .recipes import recipe

    return recipe(task).with_options(tuple(task_options))


def _built_differently(warm: Path, target: float, options: tuple[str, ...], step_confidence: bool) -> str | None:
    """Why the warm-up in ``warm`` does not match this comparison's (None when it does, or cannot tell)."""
    try:
        cfg = json.loads((warm / "warmup.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    built = cfg.get("stop_at_accuracy")
    if built is not None and abs(float(built) - target) > 1e-12:
        return f"was warmed up to train accuracy {built}, this comparison asks for {target} (--warmup-target)"
    if tuple(cfg.get("task_options", ())) != options:
        return f"was warmed up with task options {list(cfg.get('task_options', ()))}, this comparison asks for {list(options)}"
    if bool(cfg.get("step_confidence", False)) != step_confidence:
        return f"was warmed up {'with' if cfg.get('step_confidence') else 'without'} --step-confidence"
    return None


def build_model(out: Path, task: str, seed: int, target: float | None = None, task_options: Sequence[str] = (),
                step_confidence: bool = False) -> tuple[str, str | None]:
    """Build (once) the tiny warmed-up model of (task, seed) by the task's recipe (with ``task_options`` added), its
    warm-up stopping at train accuracy ``target`` (default: the recipe's); ``(path, error or None)``. A model built
    before otherwise (another target, task options or ``step_confidence``) is an error: every run of a folder starts
    from the same models."""
    r = task_recipe(task, task_options)
    target = r.warmup_target if target is None else float(target)
    d = model_dir(out, task, seed)
    warm = d / "warmup"
    if (warm / "warmup.json").is_file():
        why = _built_differently(warm, target, tuple(r.task_options), step_confidence)
        return str(warm), None if why is None else f"{warm} {why}: give it another --out"
    d.mkdir(parents=True, exist_ok=True)
    log = d / "build.log"
    if not (d / "tiny" / "config.json").is_file():
        rc, _, _ = _run_cli(["llm", "init-tiny", str(d / "tiny"), *r.tiny, "--seed", str(seed)], log)
        if rc != 0:
            return str(warm), f"init-tiny exited with status {rc} (log: {log})"
    if warm.exists():  # a warm-up that stopped before writing its summary: start it again
        import shutil

        shutil.rmtree(warm)
    rc, _, _ = _run_cli(["llm", "warmup", "--model", str(d / "tiny"), "--task", task, "--out", str(warm), *r.warmup,
                         "--stop-at-accuracy", str(target), "--seed", str(seed), "--self-report", "both",
                         "--teacher-share", "0.25", "--no-progress", *r.task_flags(),
                         *(["--step-confidence"] if step_confidence else [])], log)
    return str(warm), None if rc == 0 else f"warmup exited with status {rc} (log: {log})"


def build_grid(methods: Sequence[MethodSpec], tasks: Sequence[str], seeds: Sequence[int], out: Path,
               models: dict[tuple[str, int], str], updates: int | None, extra: Sequence[str], eval_args: Sequence[str],
               retries: int = 0, task_options: Sequence[str] = ()) -> list[RunSpec]:
    """Every (task, method, seed), tasks outermost; each run's train flags are its task recipe's (with
    ``task_options`` added), then the method's own, then ``--extra``."""
    from .recipes import RECIPES

    specs = []
    for task in tasks:
        r = task_recipe(task, task_options) if task in RECIPES else None
        base = (*r.train, *r.task_flags(train=True)) if r is not None else (
            ("--task-options", *task_options) if task_options else ())
        budget = updates or (r.updates if r is not None else 100)
        for m in methods:
            for s in seeds:
                run_dir = Path(out) / "runs" / task / m.label / f"seed_{s}"
                specs.append(RunSpec(task, m.label, m.algo, s, budget, str(run_dir),
                                     ("--model", models[(task, s)], *base, *m.args, *extra), kind="llm",
                                     eval_args=tuple(eval_args), retries=retries))
    return specs


def _models(args: argparse.Namespace, out: Path, seeds: list[int], failures: list[str]) -> dict[tuple[str, int], str]:
    """The model each (task, seed) starts from: ``--model``, or the comparison's own tiny models, built where missing
    (a failed build goes into ``failures``)."""
    if args.model is not None:
        from ..llm.models import record_model

        folder = record_model(args.model)[0]  # a named model: the folder it is converted into, once
        return {(t, s): folder for t in args.tasks for s in seeds}
    if args.report_only:
        return {(t, s): str(model_dir(out, t, s) / "warmup") for t in args.tasks for s in seeds}
    models: dict[tuple[str, int], str] = {}
    jobs = [(t, s) for t in args.tasks for s in seeds]
    print(f"building {len(jobs)} tiny models (skipped where built)", flush=True)
    with ThreadPoolExecutor(args.workers) as pool:
        build = lambda j: build_model(out, *j, args.warmup_target, args.task_option, args.step_confidence)
        for (t, s), (path, err) in zip(jobs, pool.map(build, jobs)):
            models[(t, s)] = path
            if err:
                failures.append(f"model {t}/seed_{s}: {err}")
                print(f"model {t}/seed_{s} failed: {err}", file=sys.stderr, flush=True)
    return models


def _train(todo: list[RunSpec], args: argparse.Namespace, on_result: Callable[[dict], None], out: Path) -> bool:
    """Train and evaluate the runs to do on the chosen backend; False when interrupted (the runs are kept)."""
    try:
        if args.backend == "ray":
            from .ray_backend import run_ray

            run_ray(todo, args.workers, on_result)
        else:
            run_local(todo, args.workers, on_result)
    except KeyboardInterrupt:
        print(f"interrupted; run the same command again to resume (runs are kept in {out / 'runs'})", file=sys.stderr)
        return False
    return True


def main(argv: list[str]) -> int:
    """``reflectrl llm compare``."""
    args = _parser().parse_args(argv)
    methods = _validate(args)
    extra = [w for a in args.extra for w in shlex.split(a)]
    check_train_args(extra, "--extra", "llm")
    out = Path(args.out).resolve()
    guard_folder(out, "comparison", "--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReflectRLError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    seeds = list(range(1, args.seeds + 1))
    failures: list[str] = []
    models = _models(args, out, seeds, failures)
    eval_args = ([] if args.self_report == "off" else ["--self-report", args.self_report]) + (
        ["--limit", str(args.eval_limit)] if args.eval_limit else [])
    specs = build_grid(methods, args.tasks, seeds, out, models, args.updates, extra, eval_args, args.retries,
                       args.task_option)
    specs = [s for s in specs if not any(f.startswith(f"model {s.env_id}/seed_{s.seed}:") for f in failures)]
    planned = [plan(s) for s in specs]
    plans = [p for p, _ in planned]
    conflicts = [why for p, why in planned if p == "conflict"]
    if conflicts and not args.report_only:  # the folder belongs to another command: refused whole, nothing written
        raise ConfigError(f"{len(conflicts)} of the {len(specs)} runs conflict with what {out} holds (e.g. "
                          f"{conflicts[0]}); nothing was trained or rewritten: use another --out")
    counts = {k: plans.count(k) for k in ("skip", "resume", "train", "conflict")}
    print(f"{len(specs)} runs: {counts['skip']} finished (skipped), {counts['resume']} to resume, {counts['train']} to "
          "train" + (f", {counts['conflict']} in conflict" if counts["conflict"] else ""), flush=True)
    results: list[dict[str, Any]] = [make_result(s, "skipped") for s, p in zip(specs, plans) if p == "skip"]
    todo = [s for s, p in zip(specs, plans) if p != "skip"]
    command = "reflectrl llm compare " + shlex.join(argv)

    def on_result(res: dict) -> None:
        materialize(res)
        results.append(res)
        tag = f"[{len(results)}/{len(specs)}] {res['name']}"
        if res["status"] == "ok":
            acc = res.get("eval_mean")
            print(f"{tag}: {res['action']}, held-out accuracy {'?' if acc is None else f'{acc:.3f}'}", flush=True)
        else:
            print(f"run {res['name']} failed: {res['error']} (log: {res['log']})", file=sys.stderr, flush=True)

    if not args.report_only and todo and not _train(todo, args, on_result, out):
        return 130
    from .llm_report import write_llm_outputs

    notes = list(failures)
    if args.report_only:
        pending = [s.name for s, p in zip(specs, plans) if p in ("resume", "train")]
        if pending:
            notes.append(f"written with --report-only: {len(pending)} of {len(specs)} runs not finished and left out")
    paths = write_llm_outputs(out, specs, results, command, [m.label for m in methods], args.tasks,
                              args.early_fraction, args.bootstrap_reps, notes)
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    failed = [r for r in results if r["status"] != "ok"]
    if failed or failures:
        print(f"{len(failed) + len(failures)} failures (see report.md)", file=sys.stderr)
        return 1
    return 0
