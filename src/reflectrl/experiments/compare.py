"""``reflectrl compare``: methods x envs x seeds, each run through the CLI in its own run directory, then
``report.md`` (IQM, probability of improvement, early-learning AUC, with bootstrap CIs) and ``curves.png``.

Layout: ``OUT/runs/{env}/{method}/seed_{s}/`` holds the run (``config.json``, ``metrics.jsonl``,
``checkpoint.safetensors``), ``train.log`` (stdout and stderr of every process of the run), ``run.json``
(method label, arguments, wall time of each attempt) and ``eval.json`` (``reflectrl eval --json``), written
last. A rerun skips runs with ``eval.json`` and resumes the ones that have a checkpoint but no evaluation,
so an interrupted comparison continues where it stopped.

``reflectrl plot`` redraws curves from run directories.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, ReflectRLError
from ..runlog import ensure_writable_dir, ensure_writable_file, guard_folder
from .rundata import EPISODIC_RETURN, load_run
from .runner import RunSpec, make_result, materialize, plan, run_local

# Flags each compare command sets itself for every run (and what it takes instead); a method's or --extra's
# arguments may not repeat them.
RESERVED = {
    "control": (("--algo", "--env-id", "--seed", "--total-timesteps", "--run-dir", "--resume", "--progress",
                 "--no-progress"), "compare", "use --env-ids, --seeds, --total-timesteps, --out"),
    "llm": (("--algo", "--task", "--seed", "--updates", "--run-dir", "--resume", "--model", "--no-progress"),
            "llm compare", "use --tasks, --seeds, --updates, --model, --out"),
}
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


# ------------------------------------------------------------------------------------------------ grid
@dataclass(frozen=True)
class MethodSpec:
    """One ``--methods`` entry: ``ALGO`` or ``LABEL=ALGO ARGS...`` (a variant with its own train flags)."""

    label: str
    algo: str
    args: tuple[str, ...] = ()


def parse_method(text: str, kind: str = "control") -> MethodSpec:
    """Parse ``"ppo"`` or ``"ppo-lr3=ppo --learning-rate 3e-4"`` (one shell word, quoted)."""
    words = shlex.split(text)
    if not words:
        raise ConfigError("empty --methods entry")
    head, args = words[0], tuple(words[1:])
    label, _, algo = head.partition("=") if "=" in head else (head, "", head)
    if not LABEL.match(label) or not algo:
        raise ConfigError(f"bad --methods entry {text!r}: use ALGO or 'LABEL=ALGO [TRAIN FLAGS]' with a label of "
                          "letters, digits, '.', '_', '+', '-'")
    check_train_args(args, f"--methods {label}", kind)
    return MethodSpec(label, algo, args)


def check_train_args(args: Sequence[str], where: str, kind: str = "control") -> None:
    """Refuse flags that the compare command of front end ``kind`` sets for every run."""
    flags, command, instead = RESERVED[kind]
    for a in args:
        if a.split("=", 1)[0] in flags:
            raise ConfigError(f"{where}: {a.split('=', 1)[0]} is set by {command} for every run; remove it ({instead})")


def check_grid_args(args: argparse.Namespace, kind: str, checks: Sequence[tuple[bool, str]]) -> list[MethodSpec]:
    """The checks both ``compare`` commands share (seeds, workers, retries, early fraction, bootstrap replicates),
    then ``checks`` of their own, then the ``--methods`` entries: parsed, distinct labels, known algos of
    ``kind``. One ConfigError for the first that fails."""
    from ..algos import algo_names

    common = [(args.seeds >= 1, "--seeds must be at least 1"), (args.workers >= 1, "--workers must be at least 1"),
              (args.retries >= 0, "--retries must be non-negative"),
              (0 < args.early_fraction <= 1, "--early-fraction must be in (0, 1]"),
              (args.bootstrap_reps >= 100, "--bootstrap-reps must be at least 100")]
    for ok, msg in [*common, *checks]:
        if not ok:
            raise ConfigError(msg)
    methods = [parse_method(m, kind) for m in args.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--methods names a method twice ({', '.join(labels)}); give variants distinct labels")
    known = algo_names(kind)
    for m in methods:
        if m.algo not in known:
            raise ConfigError(f"unknown --algo {m.algo!r} in --methods; available: {', '.join(known)}")
    return methods


def run_dir_for(out: Path, env_id: str, method: str, seed: int) -> Path:
    """``OUT/runs/{env}/{method}/seed_{s}`` (a ``/`` in an env id, as in ``ALE/Pong-v5``, becomes ``__``)."""
    return Path(out) / "runs" / env_id.replace("/", "__") / method / f"seed_{seed}"


def build_grid(methods: Sequence[MethodSpec], env_ids: Sequence[str], seeds: Sequence[int], total_timesteps: int,
               out: Path, extra: Sequence[str] = (), eval_episodes: int = 20, retries: int = 0) -> list[RunSpec]:
    """Every (env, method, seed), envs outermost."""
    return [RunSpec(env, m.label, m.algo, s, total_timesteps, str(run_dir_for(out, env, m.label, s)),
                    (*m.args, *extra), eval_episodes, retries=retries)
            for env in env_ids for m in methods for s in seeds]


def _backend(name: str) -> Callable[[Sequence[RunSpec], int, Callable[[dict], None]], None]:
    if name == "ray":
        from .ray_backend import run_ray

        return run_ray
    return run_local


# ------------------------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="reflectrl compare",
        description="Train and evaluate methods x envs x seeds (each run in OUT/runs/{env}/{method}/seed_{s}), then "
                    "write OUT/report.md and OUT/curves.png. Rerunning the same command skips finished runs and "
                    "resumes interrupted ones.")
    ap.add_argument("--methods", nargs="+", required=True, metavar="METHOD",
                    help="--algo names, or variants 'LABEL=ALGO TRAIN FLAGS' (quoted), e.g. 'ppo-lr1e3=ppo "
                         "--learning-rate 1e-3'")
    ap.add_argument("--env-ids", nargs="+", required=True, metavar="ENV", help="Gymnasium env ids")
    ap.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds 1..N per method and env (default 5)")
    ap.add_argument("--total-timesteps", type=int, required=True, metavar="T", help="environment steps per run")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder (runs/, report.md, curves.png)")
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="local: a pool of processes on this machine; ray: one Ray task per run (RAY_ADDRESS or a "
                         "cluster from `ray start`, else a local Ray instance)")
    ap.add_argument("--workers", type=int, default=2, metavar="K",
                    help="runs at a time (local pool; CPUs of a local Ray instance)")
    ap.add_argument("--retries", type=int, default=0, metavar="N",
                    help="attempts after a failed one (it resumes from its last checkpoint) before a run is reported "
                         "failed; on the Ray backend a lost worker is retried as often (default 0)")
    ap.add_argument("--eval-episodes", type=int, default=20, metavar="N",
                    help="evaluation episodes per run (default 20)")
    ap.add_argument("--baseline", default="ppo", metavar="METHOD",
                    help="method the probability of improvement compares to (default ppo)")
    ap.add_argument("--early-fraction", type=float, default=0.2, metavar="F",
                    help="share of the steps budget the early-learning AUC covers (default 0.2)")
    ap.add_argument("--bootstrap-reps", type=int, default=5000, metavar="N",
                    help="bootstrap resamples per CI (default 5000)")
    ap.add_argument("--stats-engine", choices=("scipy", "rliable"), default="scipy",
                    help="bootstrap implementation (rliable needs `pip install rliable 'pandas<3'`)")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: write report.md and curves.png from the runs finished so far (the others "
                         "are listed as not finished or in conflict), e.g. while the comparison runs in another "
                         "process")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], metavar="TRAIN FLAGS",
                    help="flags passed to every `reflectrl train` (must come last), e.g. --extra --num-envs 8")
    return ap


def _validate(args: argparse.Namespace) -> list[MethodSpec]:
    from ..control.envs import check_env_id

    methods = check_grid_args(args, "control", [(args.total_timesteps > 0, "--total-timesteps must be positive"),
                                                (args.eval_episodes >= 1, "--eval-episodes must be at least 1")])
    for env in args.env_ids:
        check_env_id(env)
    if args.stats_engine == "rliable":
        from ..eval.stats import rliable_available

        if not rliable_available():
            raise ConfigError("--stats-engine rliable needs rliable: pip install rliable 'pandas<3'")
    return methods


def write_outputs(out: Path, specs: Sequence[RunSpec], results: Sequence[dict], command: str,
                  args: argparse.Namespace, methods: Sequence[MethodSpec],
                  notes: Sequence[str] = ()) -> tuple[Path, Path | None]:
    """``report.md`` and ``curves.png`` from the run directories of ``specs`` (failed runs listed)."""
    from .plots import plot_runs
    from .report import ReportOptions, build_report

    runs = []
    for s in specs:
        if (Path(s.run_dir) / "config.json").is_file():
            r = load_run(s.run_dir)
            if r.final_return is not None:
                runs.append(r)
    opts = ReportOptions(command=command, methods=[m.label for m in methods], env_ids=args.env_ids,
                         baseline=args.baseline, early_fraction=args.early_fraction, n_resamples=args.bootstrap_reps,
                         engine=args.stats_engine, failures=[r for r in results if r["status"] != "ok"])
    opts.notes.extend(notes)
    if args.baseline not in opts.methods:
        opts.notes.append(f"the baseline {args.baseline!r} is not among --methods: no probability of improvement.")
    curves: Path | None = None
    if runs:
        try:
            curves = plot_runs(runs, EPISODIC_RETURN, out / "curves.png")
        except ReflectRLError as exc:
            opts.notes.append(f"no curves: {exc}")
    opts.curves = curves.name if curves else None
    report = out / "report.md"
    tmp = report.with_suffix(".md.tmp")
    tmp.write_text(build_report(runs, out, opts, args.eval_episodes))
    tmp.replace(report)
    return report, curves


def main(argv: list[str]) -> int:
    """``reflectrl compare``."""
    args = _parser().parse_args(argv)
    methods = _validate(args)
    extra = [w for a in args.extra for w in shlex.split(a)]
    check_train_args(extra, "--extra")
    guard_folder(Path(args.out).resolve(), "comparison", "--out")
    out = ensure_writable_dir(Path(args.out).resolve(), "--out")
    specs = build_grid(methods, args.env_ids, range(1, args.seeds + 1), args.total_timesteps, out, extra,
                       args.eval_episodes, args.retries)
    planned = [plan(s) for s in specs]  # (action, why) per run
    plans = [p for p, _ in planned]
    todo = [s for s, p in zip(specs, plans) if p != "skip"]
    counts = {k: plans.count(k) for k in ("skip", "resume", "train", "conflict")}
    print(f"{len(specs)} runs: {counts['skip']} finished (skipped), {counts['resume']} to resume, "
          f"{counts['train']} to train" + (f", {counts['conflict']} in conflict" if counts["conflict"] else ""),
          flush=True)
    results = [make_result(s, "skipped") for s, p in zip(specs, plans) if p == "skip"]
    command = "reflectrl compare " + shlex.join(argv)
    if args.report_only:
        pending = [s.name for s, p in zip(specs, plans) if p in ("resume", "train")]
        notes = [f"written with --report-only: {len(pending)} of {len(specs)} runs not finished and left out "
                 f"({', '.join(pending)})"] if pending else []
        notes += [f"left out, in conflict: {why}" for p, why in planned if p == "conflict"]
        report, curves = write_outputs(out, specs, results, command, args, methods, notes)
        print(f"report: {report}" + (f"\ncurves: {curves}" if curves else ""))
        return 0

    def on_result(res: dict) -> None:
        materialize(res)
        results.append(res)
        tag = f"[{len(results)}/{len(specs)}] {res['name']}"
        if res["status"] == "ok":
            done = ("finished earlier" if res["action"] == "skipped"
                    else f"{res['action']} in {res.get('wall_s', 0.0):.1f} s")
            ret = res.get("eval_mean")
            print(f"{tag}: {done}, eval return {'?' if ret is None else f'{ret:.2f}'}", flush=True)
        else:
            print(f"run {res['name']} failed: {res['error']} (log: {res['log']})", file=sys.stderr, flush=True)

    try:
        if todo:
            _backend(args.backend)(todo, args.workers, on_result)
    except KeyboardInterrupt:
        print(f"interrupted; run the same command again to resume (finished runs are kept in {out / 'runs'})",
              file=sys.stderr)
        return 130
    report, curves = write_outputs(out, specs, results, command, args, methods)
    failed = [r for r in results if r["status"] != "ok"]
    print(f"report: {report}" + (f"\ncurves: {curves}" if curves else ""))
    if failed:
        print(f"{len(failed)} of {len(specs)} runs failed: {', '.join(r['name'] for r in failed)} (see report.md)",
              file=sys.stderr)
        return 1
    return 0


def check_image_path(path: str) -> Path:
    """``path`` if matplotlib can write an image there (a format it knows, in a writable directory), else
    ConfigError naming the formats."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    p = Path(path)
    formats = FigureCanvasAgg.get_supported_filetypes()
    ext = p.suffix[1:].lower()
    if ext and ext not in formats:
        raise ConfigError(f"--out {p}: matplotlib cannot write .{ext} files; use one of "
                          f"{', '.join('.' + f for f in sorted(formats))}")
    return ensure_writable_file(p, "--out")


def plot_main(argv: list[str]) -> int:
    """``reflectrl plot``: curves from run directories or compare output folders."""
    from .plots import plot_metric_over_time

    ap = argparse.ArgumentParser(prog="reflectrl plot",
                                 description="Draw logged metrics over training from run directories (or folders "
                                             "holding them, such as a compare --out folder), one subplot per env and "
                                             "metric, one line per method (mean over seeds, 95% t band).")
    ap.add_argument("paths", nargs="+", metavar="RUN_DIR_OR_FOLDER")
    ap.add_argument("--out", required=True, metavar="FILE", help="image file to write (.png, .pdf, .svg)")
    ap.add_argument("--metric", action="append", default=None, metavar="NAME",
                    help=f"metric from metrics.jsonl; repeat for several rows (default {EPISODIC_RETURN})")
    ap.add_argument("--bcal-map", action="store_true",
                    help="instead: map refgrpo-seed's b_cal over two observation dims of one run (fresh rollouts of "
                         "its final policy and predictor; LunarLander dims 0 1 = the lander's x, y)")
    ap.add_argument("--dims", type=int, nargs=2, default=(0, 1), metavar=("I", "J"),
                    help="observation dims of the --bcal-map axes (default 0 1)")
    ap.add_argument("--rollouts", type=int, default=1, metavar="N", help="batches collected for --bcal-map (default 1)")
    args = ap.parse_args(argv)
    check_image_path(args.out)
    if args.bcal_map:
        from .bcal_map import plot_bcal_map

        if len(args.paths) != 1:
            raise ConfigError("--bcal-map takes one run directory")
        path = plot_bcal_map(args.paths[0], args.out, args.rollouts, tuple(args.dims))
        print(f"wrote {path}")
        return 0
    path = plot_metric_over_time(args.paths, args.metric or [EPISODIC_RETURN], args.out)
    print(f"wrote {path}")
    return 0
