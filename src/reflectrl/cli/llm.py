"""``reflectrl llm``: init-tiny, get-model, warmup, train (GRPO family), eval, export, compare, recipes.

Every error a user can cause ends in one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..runlog import strict
from .eval_report import report_warnings, summary_lines
from .util import check_device, check_seed, print_json, run_command

USAGE = """usage: reflectrl llm COMMAND [ARGS]

commands:
  init-tiny  write a tiny random-init causal LM + character tokenizer (Hugging Face format)
  get-model  a named model ({models}) or a GGUF file as a checked Hugging Face directory
  warmup     supervised fine-tuning on a task's demonstrations
  train      RL on a verifiable task: --algo {algos} (--resume RUN_DIR continues a run)
  eval       held-out accuracy (Wilson interval) or pass@k of a model or run directory; --self-report adds calibration
  export     a run's latest checkpoint as a model folder: a LoRA run's adapter, or (--merge) a full Hugging Face model
  compare    methods x tasks x seeds from shared tiny models: report.md, curves.png, reliability diagrams
  recipes    the recipes of `llm train --recipe NAME`: task, model, budget and what each reached where measured
"""

TRAIN_HEADER = """usage: reflectrl llm train [--algo {algos}] [--resume RUN_DIR] --task TASK [--set KEY=VALUE ...] \
--model PATH [FLAGS]

Train a causal LM by RL on a verifiable task. --algo applies a variant's defaults (grpo: mean/std
group advantages, seq-mean-token-mean; drgrpo: mean-centred, seq-mean-token-sum-norm; dapo:
clip-higher 0.28, token-mean, zero-variance groups filtered); explicit flags override them.
--resume RUN_DIR continues an interrupted or finished run (optionally with a larger --updates).
"""


def cmd_init_tiny(argv: list[str]) -> int:
    from ..llm.tiny import ARCHS, init_tiny

    ap = argparse.ArgumentParser(prog="reflectrl llm init-tiny", description="Write a tiny random-init causal LM "
                                 "and a character-level tokenizer, loadable by AutoModelForCausalLM/AutoTokenizer.")
    ap.add_argument("out_dir", help="directory to write (config.json, model.safetensors, tokenizer.json)")
    ap.add_argument("--arch", choices=ARCHS, default="llama", help="architecture (default llama)")
    ap.add_argument("--layers", type=int, default=2, help="transformer layers (default 2)")
    ap.add_argument("--width", type=int, default=64, help="hidden size (default 64)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--max-positions", type=int, default=1024, help="longest sequence (default 1024)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random init (default 0)")
    ap.add_argument("--force", action="store_true", help="replace the model in OUT_DIR if it holds one")
    a = ap.parse_args(argv)
    check_seed(a.seed)
    out = init_tiny(a.out_dir, a.arch, a.layers, a.width, a.heads, a.max_positions, a.seed, force=a.force)
    print(json.dumps({"out": str(out), **json.loads((out / "reflectrl_tiny.json").read_text())}))
    return 0


def cmd_get_model(argv: list[str]) -> int:
    from ..llm.models import MODEL_INFO, NAMED_MODELS, get_model

    ap = argparse.ArgumentParser(prog="reflectrl llm get-model", description="Dequantize a named model (shipped in a "
                                 "Python package as a GGUF file) or a GGUF file of your own into a standard Hugging Face "
                                 "model directory, check it by loading it back, and print its path. --model NAME or "
                                 "--model FILE.gguf does the same on first use.")
    ap.add_argument("model", help=f"a named model ({', '.join(NAMED_MODELS)}) or a path to a .gguf file")
    ap.add_argument("--out", default=None, help="directory to write (default: the cache, $REFLECTRL_CACHE/models or "
                    "~/.cache/reflectrl/models)")
    ap.add_argument("--force", action="store_true", help="convert again even if the directory holds a converted model")
    ap.add_argument("--json", action="store_true", help="print one JSON object (path and what was checked)")
    a = ap.parse_args(argv)
    out = get_model(a.model, a.out, force=a.force)
    if a.json:
        print(json.dumps({"path": str(out), **json.loads((out / MODEL_INFO).read_text())}))
    else:
        print(out)
    return 0


def cmd_warmup(argv: list[str]) -> int:
    import tyro

    from ..llm.warmup import WarmupConfig, warmup
    from .util import merge_task_options

    front = argparse.ArgumentParser(add_help=False)
    front.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sets, argv = front.parse_known_args(argv)
    cfg = tyro.cli(WarmupConfig, args=argv, prog="reflectrl llm warmup")
    if sets.set:  # --set KEY=VALUE, as on train and eval; an alias of --task-options
        cfg = dataclasses.replace(cfg, task_options=merge_task_options(("--set", sets.set),
                                                                       ("--task-options", cfg.task_options)))
    check_seed(cfg.seed)
    check_device(cfg.device)
    print_json({k: v for k, v in warmup(cfg).items() if k != "config"})
    return 0


def _train_front(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="reflectrl llm train", add_help=False)
    ap.add_argument("--algo", default=None)
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return ap.parse_known_args(argv)


def cmd_train(argv: list[str]) -> int:
    from ..algos import algo_names
    from .util import config_from_flags, merge_task_options, print_json, resume_from_cli

    front, rest = _train_front(argv)
    asked_help = "-h" in rest or "--help" in rest
    if front.resume is not None:
        if asked_help:
            print(TRAIN_HEADER.format(algos="|".join(algo_names("llm"))))
        if front.set or front.recipe:
            raise ConfigError("--resume continues a run with its own settings and task options; "
                              f"{'--set' if front.set else '--recipe'} cannot be combined with it")
        trainer = resume_from_cli(front.resume, rest, "llm", front.algo)
    else:
        algo, default, sets = _new_run_defaults(front, rest, asked_help)
        if asked_help:
            from ..experiments.recipes import recipe_names
            from .train_help import train_help

            print(train_help(algo, default, algo_names("llm"), recipe_names()))
            return 0
        # under torchrun, one process probes the run directory
        cfg = config_from_flags(default, rest, f"reflectrl llm train --algo {algo.name}", "llm", _rank() == 0)
        if front.set and cfg.task_options != default.task_options:  # --task-options too: aliases that must agree
            cfg = dataclasses.replace(cfg, task_options=merge_task_options(("--set", sets),
                                                                           ("--task-options", cfg.task_options)))
        check_device(cfg.device)
        trainer = algo.make(cfg)
    summary = trainer.learn()
    if _rank() == 0:  # under torchrun, one summary line
        print_json(summary)
    return 0


def _new_run_defaults(front: argparse.Namespace, rest: list[str], asked_help: bool) -> tuple[Any, Any, list[str]]:
    """The algo of a new run, its config before the explicit flags (the algo's defaults, those the model implies, a
    recipe's settings) and its task options: a recipe's, less the keys ``--set`` gives (all of them when ``--task``
    names another task), then the ``--set`` ones."""
    from ..algos import get_algo
    from ..tasks.base import parse_options
    from .util import config_from_flags, foreign_flags

    recipe_flags: list[str] = []
    sets = list(front.set)
    algo_name = front.algo or "grpo"
    if front.recipe is not None:
        from ..experiments.recipes import train_recipe

        r = train_recipe(front.recipe)
        given = _given_flags(rest)
        if not r.model and not given.get("model") and not asked_help:
            raise ConfigError(f"recipe {r.name} trains a tiny model warmed up on {r.task}: give it with --model DIR "
                              "(`reflectrl llm recipes` says how one is built)")
        keys = {o.partition("=")[0].strip() for o in sets}
        own = r.task_options if given.get("task") in (None, r.task) else ()
        sets = [*(o for o in own if o.partition("=")[0].strip() not in keys), *sets]
        recipe_flags = ["--task", r.task, *(["--model", r.model] if r.model else []), *r.flags]
        algo_name = front.algo or r.algo
    algo = get_algo("llm", algo_name)
    foreign_flags(rest, "llm", algo.name)  # another method's option: say whose it is
    parse_options(sets)  # one clear error for a malformed KEY=VALUE
    # the defaults that follow the model and LoRA (learning rate, group size, temperature): explicit flags win
    default = algo.config(task_options=tuple(sets), **_model_flags([*recipe_flags, *rest]))
    if recipe_flags:
        default = config_from_flags(default, recipe_flags, f"reflectrl llm train --recipe {front.recipe}", "llm", False)
    return algo, default, sets


def _given_flags(rest: list[str]) -> dict[str, Any]:
    """``--model``, ``--task`` and ``--lora-r`` of a train command line (left in it for tyro), where given."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--model", default=None)
    ap.add_argument("--task", default=None)
    ap.add_argument("--lora-r", "--lora_r", dest="lora_r", default=None)
    known, _ = ap.parse_known_args(rest)
    return {k: v for k, v in vars(known).items() if v is not None}


def _model_flags(rest: list[str]) -> dict[str, Any]:
    """``--model`` and ``--lora-r`` of a train command line (the last of each), for the defaults they imply."""
    given = _given_flags(rest)
    out: dict[str, Any] = {}
    if given.get("model"):
        out["model"] = given["model"]
    if "lora_r" in given:
        with contextlib.suppress(ValueError):  # tyro reports the malformed value
            out["lora_r"] = int(given["lora_r"])
    return out


def _rank() -> int:
    """This process's rank under torchrun (``RANK``), 0 otherwise."""
    import os

    return int(os.environ.get("RANK", "0") or 0)


def cmd_eval(argv: list[str]) -> int:
    from ..llm.evaluate import evaluate

    a = _eval_parser().parse_args(argv)
    _check_eval_args(a, argv)
    res = evaluate(a.model_or_run_dir, a.task, a.split, a.samples, n=a.n, temperature=a.temperature, limit=a.limit,
                   max_new_tokens=a.max_new_tokens, max_turns=a.max_turns, confidence=a.confidence, seed=a.seed,
                   self_report=a.self_report, task_options=None if a.set is None else tuple(a.set),
                   device=a.device, chat=a.chat, model=a.model, transcripts=a.transcripts is not None,
                   progress=not a.no_progress)
    episodes = res.pop("episodes", None)
    if a.transcripts is not None:
        Path(a.transcripts).parent.mkdir(parents=True, exist_ok=True)
        with open(a.transcripts, "w") as fh:
            for ep in episodes or []:
                fh.write(json.dumps(strict(ep)) + "\n")
    for line in report_warnings(res):
        print(f"warning: {line}", file=sys.stderr)
    if a.json:
        print_json(res)
    # the summary in words: after the JSON line, on stderr (stdout stays one JSON object); else the output itself
    out = sys.stderr if a.json else sys.stdout
    for line in summary_lines(res, a.model_or_run_dir):
        print(line, file=out)
    return 0


def _eval_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reflectrl llm eval", description="Accuracy of a model directory or of an LLM "
                                 "run directory's latest checkpoint: greedy with a Wilson interval, or pass@k.")
    ap.add_argument("model_or_run_dir",
                    help="Hugging Face model directory (or a LoRA run's adapter folder, RUN_DIR/model), or a run "
                         "directory of `reflectrl llm train` (its latest checkpoint)")
    ap.add_argument("--task", default=None, help="task name (default: the run's task)")
    ap.add_argument("--split", default="heldout", help="problem split (default heldout)")
    ap.add_argument("--samples", type=int, default=0, help="k of pass@k: sample instead of greedy decoding")
    ap.add_argument("--n", type=int, default=None, help="samples per problem for pass@k (default k)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature with --samples")
    ap.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="tokens per completion (default: the run's, else the task's own budget, which a chat model "
                         "gets larger: `reflectrl tasks show TASK` prints both)")
    ap.add_argument("--max-turns", type=int, default=None,
                    help="turns of a multi-turn task (default: the run's/task's)")
    ap.add_argument("--confidence", type=float, default=0.95, help="confidence level of the interval")
    ap.add_argument("--seed", type=int, default=0, help="seed of the samples")
    ap.add_argument("--device", default="cpu", help="torch device")
    ap.add_argument("--self-report", choices=("reflect", "confidence", "both", "inline", "inline-reflect"),
                    default=None,
                    help="after each episode ask for a reflection (solved/unsolved) and/or a confidence in [0, 1], "
                         "or (inline, inline-reflect) read the confidence or reflection the answer itself states (a "
                         "chat model is asked for it in the first message and completes the tag its answer's message "
                         "is continued with), and add their calibration (reflection accuracy, under/overconfidence, "
                         "ECE, Brier, AUROC)")
    ap.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                    help="task option (default: the run's options); repeatable")
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="a run's base model, where it has moved since the run (default: the path in its config.json)")
    ap.add_argument("--chat", choices=("auto", "on", "off"), default=None,
                    help="episodes as conversations in the model's chat template (default: the run's, else auto: when "
                         "the tokenizer has one); off: raw prompts")
    ap.add_argument("--json", action="store_true", help="print one JSON object (accuracy, n, ci, ...)")
    ap.add_argument("--transcripts", default=None, metavar="FILE",
                    help="write every episode (problem id, correct, the environment's infos, the transcript) to FILE "
                         "as JSON lines")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress on stderr (a bar with the time left on a terminal, else a log line every 5%% and "
                         "at least every minute) and no line suggesting --limit for an evaluation projected to take "
                         "over ten minutes")
    return ap


def _check_eval_args(a: argparse.Namespace, argv: list[str]) -> None:
    """One clear error for settings that cannot go together, before any model loads."""
    if a.transcripts is not None:
        from ..runlog import ensure_writable_file

        ensure_writable_file(a.transcripts, "--transcripts")
    if a.samples < 0 or not 0 < a.confidence < 1 or (a.limit is not None and a.limit < 1):
        raise ConfigError("--samples must be >= 0, --limit >= 1 and --confidence in (0, 1)")
    for flag, val in (("--max-new-tokens", a.max_new_tokens), ("--max-turns", a.max_turns)):
        if val is not None and val < 1:
            raise ConfigError(f"{flag} must be >= 1, got {val}")
    if not a.samples and (a.n is not None or any(x.split("=")[0] == "--temperature" for x in argv)):
        raise ConfigError("--n and --temperature set how --samples samples: give --samples k (greedy decoding "
                          "uses neither)")
    if a.samples and a.temperature <= 0:
        raise ConfigError("--samples needs --temperature > 0")
    check_seed(a.seed)
    check_device(a.device)


def cmd_export(argv: list[str]) -> int:
    from ..llm.export import export_run

    ap = argparse.ArgumentParser(prog="reflectrl llm export", description="Write the latest checkpoint of a run of "
                                 "`reflectrl llm train` as a model folder and print one JSON object (out, format, "
                                 "bytes, base_model). A LoRA run gives its adapter alone (peft's files and a note naming "
                                 "the base model), which every reflectrl command loads as a model; --merge gives a full "
                                 "Hugging Face model directory that AutoModelForCausalLM.from_pretrained loads. A full "
                                 "fine-tuning run gives its whole model either way.")
    ap.add_argument("run_dir", help="a run directory of `reflectrl llm train`")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="directory to write (default: RUN_DIR/model, which is replaced; with --merge on a LoRA run "
                         "RUN_DIR/merged)")
    ap.add_argument("--merge", action="store_true",
                    help="merge a LoRA adapter into the base weights and write a full Hugging Face model directory")
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="the run's base model, where it has moved since the run (default: the path in its config.json)")
    ap.add_argument("--force", action="store_true", help="replace what --out DIR holds when it is not empty")
    a = ap.parse_args(argv)
    print(json.dumps(export_run(a.run_dir, a.out, merge=a.merge, model=a.model, force=a.force)))
    return 0


def cmd_compare(argv: list[str]) -> int:
    from ..experiments.llm_compare import main as compare_main

    return compare_main(argv)


def cmd_recipes(argv: list[str]) -> int:
    from ..experiments.recipe_results import RESULTS, describe
    from ..experiments.recipes import recipe_names, train_recipe

    ap = argparse.ArgumentParser(prog="reflectrl llm recipes", description="List the recipes of `reflectrl llm train "
                                 "--recipe NAME`: each one's task, model, budget, flags and what it is expected to reach, "
                                 "read from the benchmark results that measured it (one file per seed); a recipe without "
                                 "such a file, or whose files record other settings, is 'not measured'.")
    ap.add_argument("--results", default=None, metavar="DIR",
                    help="the folder of benchmark results (default: benchmarks/results of the checkout reflectrl runs "
                         "from)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per recipe, one a line")
    a = ap.parse_args(argv)
    results = RESULTS if a.results is None else Path(a.results)
    if a.results is not None and not results.is_dir():
        raise ConfigError(f"--results {a.results} is not a folder")
    for name in recipe_names():
        d = describe(train_recipe(name), results)
        if a.json:
            print_json(d)
            continue
        exp = d["expected"]
        print(f"{d['name']}: {d['about']}")
        rows = [("task", d["task"]), ("model", d["model"]), ("budget", d["budget"]), ("expected", exp["text"])]
        if exp["measured"]:
            rows.append(("measured", f"in {results}: {exp['measured']}"))
        for key, val in [*rows, ("run", d["command"]), ("flags", d["flags"])]:
            print(f"  {key:<9} {val}")
    return 0


COMMANDS = {"init-tiny": cmd_init_tiny, "get-model": cmd_get_model, "warmup": cmd_warmup, "train": cmd_train, "eval": cmd_eval,
            "export": cmd_export, "compare": cmd_compare, "recipes": cmd_recipes}


def main(argv: list[str] | None = None) -> int:
    """``reflectrl llm COMMAND ...``."""
    from ..algos import algo_names

    argv = list(sys.argv[1:] if argv is None else argv)
    from ..llm.models import NAMED_MODELS

    usage = USAGE.format(algos="|".join(algo_names("llm")), models=", ".join(NAMED_MODELS))
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"error: unknown llm command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return run_command(COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
