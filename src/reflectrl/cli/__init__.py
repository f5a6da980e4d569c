"""The ``reflectrl`` command line: train, eval, presets, sandbox, compare, plot, llm, tasks, calibration, demo.

Every error a user can cause ends in one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..errors import ConfigError
from .util import check_seed, run_command

TRAIN_HEADER = """usage: reflectrl train [--algo {algos}] [--preset NAME] [--resume RUN_DIR] [HYPERPARAMETER FLAGS]

Train an agent. --preset NAME starts from a named preset (named after its env id; see
`reflectrl presets`); explicit flags override the preset's values. --resume RUN_DIR continues an
interrupted or finished run from its latest checkpoint (optionally with a larger --total-timesteps).
"""


def _train_front(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="reflectrl train", add_help=False)
    ap.add_argument("--algo", default=None)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--resume", default=None)
    return ap.parse_known_args(argv)


def cmd_train(argv: list[str]) -> int:
    """``reflectrl train``: new run (the algo's config flags, optionally on a preset) or ``--resume``."""
    from ..algos import algo_names, get_algo
    from ..control.config import PRESETS
    from .util import config_from_flags, print_json, resume_from_cli

    front, rest = _train_front(argv)
    asked_help = "-h" in rest or "--help" in rest
    if asked_help and front.resume is not None:
        print(TRAIN_HEADER.format(algos="|".join(algo_names("control"))))
    if front.resume is not None:
        trainer = resume_from_cli(front.resume, rest, "control", front.algo, front.preset)
    else:
        algo = get_algo("control", front.algo or "ppo")
        if front.preset is not None and front.preset not in PRESETS:
            raise ConfigError(f"unknown preset {front.preset!r}; available: {', '.join(sorted(PRESETS))}")
        default = algo.config_cls()
        if front.preset:
            fields = {f.name for f in dataclasses.fields(algo.config_cls)}
            unknown = sorted(set(PRESETS[front.preset]) - fields)
            if unknown:
                raise ConfigError(f"preset {front.preset!r} sets {', '.join(unknown)}, which --algo {algo.name} "
                                  "does not have; presets are for the PPO-family algos")
            default = algo.config_cls(**PRESETS[front.preset])
        if asked_help:
            from .train_help import control_train_help

            print(control_train_help(algo, default, algo_names("control"), sorted(PRESETS)))
            return 0
        trainer = algo.make(config_from_flags(default, rest, f"reflectrl train --algo {algo.name}", "control"))
    print_json(trainer.learn())
    return 0


def cmd_eval(argv: list[str]) -> int:
    """``reflectrl eval RUN_DIR``: mean/std return of the deterministic policy."""
    from ..control.evaluate import EVAL_SEED, evaluate

    ap = argparse.ArgumentParser(prog="reflectrl eval", description="Evaluate a run's latest checkpoint.")
    ap.add_argument("run_dir", help="run directory written by `reflectrl train`")
    ap.add_argument("--episodes", type=int, default=20, help="episodes to run (default 20)")
    ap.add_argument("--seed", type=int, default=EVAL_SEED, help="seed of the evaluation episodes' resets")
    ap.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic policy")
    ap.add_argument("--json", action="store_true", help="print one JSON object with mean, std, episodes")
    args = ap.parse_args(argv)
    if args.episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    check_seed(args.seed)
    import numpy as np

    rets = evaluate(args.run_dir, args.episodes, args.seed, deterministic=not args.stochastic)
    out = {"mean": float(np.mean(rets)), "std": float(np.std(rets)), "episodes": len(rets), "returns": rets}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.run_dir}: mean return {out['mean']:.2f} +/- {out['std']:.2f} over {len(rets)} episodes")
    return 0


def cmd_presets(argv: list[str]) -> int:
    """``reflectrl presets``: the named presets and their values."""
    from ..control import PRESETS

    argparse.ArgumentParser(prog="reflectrl presets", description="List the named presets.").parse_args(argv)
    for name, values in PRESETS.items():
        print(f"{name}: " + json.dumps(values))
    return 0


def cmd_sandbox(argv: list[str]) -> int:
    """``reflectrl sandbox ...``: run untrusted code against tests in the sandbox."""
    from .sandbox import main as sandbox_main

    return sandbox_main(argv)


def _delegate(module: str, func: str = "main"):
    """A command implemented in another module as ``main(argv) -> int`` (imported only when used)."""

    def run(argv: list[str]) -> int:
        import importlib

        return getattr(importlib.import_module(module), func)(argv)

    return run


COMMANDS = {
    "train": cmd_train, "eval": cmd_eval, "presets": cmd_presets, "sandbox": cmd_sandbox, "demo": _delegate("reflectrl.cli.demo"),
    "compare": _delegate("reflectrl.experiments.compare", "main"),
    "plot": _delegate("reflectrl.experiments.compare", "plot_main"),
    "llm": _delegate("reflectrl.cli.llm"), "tasks": _delegate("reflectrl.cli.tasks"),
    "calibration": _delegate("reflectrl.cli.calibration"),
}

USAGE = """usage: reflectrl COMMAND [ARGS]

commands:
  train     train an agent (reflectrl train --help)
  eval      evaluate a run directory's latest checkpoint
  presets   list the named hyperparameter presets
  sandbox   run untrusted code against unit tests in the sandbox: run, capabilities
  compare   methods x envs x seeds, with report.md and curves.png
  plot      redraw curves from run directories
  llm       LLM agents: {llm} (reflectrl llm --help)
  tasks     verifiable tasks: list, show, validate
  calibration  calibration of self-reports from any trainer's rows (JSON lines): metrics, reliability diagram,
               abstention threshold
  demo      ppo, refgrpo-seed, gear-seed on LunarLander-v3, then the real model's held-out accuracy and
            confidence before and after a few GRPO updates with LoRA (reflectrl demo --help)
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``reflectrl`` console script."""
    from_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        code = 0 if argv else 2

        def usage(_: list[str]) -> int:
            from .llm import COMMANDS as LLM_COMMANDS

            print(USAGE.format(llm=", ".join(LLM_COMMANDS)))
            return code

        return run_command(usage, [])  # a closed pipe (`reflectrl --help | head`) is not an error
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    code = run_command(COMMANDS[argv[0]], argv[1:])
    if from_process:
        from ..trainer import ignore_late_interrupts

        ignore_late_interrupts()
    return code


if __name__ == "__main__":
    sys.exit(main())
