"""Every command and code example in README.md and docs/*.md runs, at tiny budgets, so the docs cannot drift.

What runs: each fenced ```bash block (one command a line; a trailing ``\\`` continues it, ``#`` starts a comment)
and each ```python block, in the order of its file, all blocks of a file in one fresh directory (a later
block sees what an earlier one wrote, as a reader following the page would). Other blocks (``text``,
untagged: layouts, help output, signatures) are not run; docs/cli.md is generated help and is checked by
tests/test_cli.py.

A block is left out when the line before it (blank lines aside) is ``<!-- docs-test: skip REASON -->``; the
reason is required. Blocks of pages that do not carry the tag yet are listed in UNTAGGED_SKIPS, each with its
reason (an entry that matches no block fails, so the list cannot go stale).

Commands run in this process through ``reflectrl.cli.main``, shrunk by the rules in SHRINK (one per
command: the budget flags it sets are listed there); ``reflectrl compare`` runs its runs in this process too
(``experiments.runner._run_cli`` replaced by ``reflectrl.cli.main``; tests/experiments/test_compare.py covers the processes).
Substitutions: ``[--flag value]`` (optional syntax) is dropped; a path with ``<time>`` is the run directory it
names; the word ``RUN_DIR`` is the newest run directory; ``reflectrl llm compare`` without ``--model`` gets a
fresh tiny model instead of the task recipe's warmed-up one. Python blocks get PY_SHRINK. A command, make target or
program with no rule fails the test and says which rule to add (or to tag the block).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import in_process_cli

from reflectrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]
RUN_LANGS = {"bash", "sh", "shell", "console", "python"}
SKIP_TAG = re.compile(r"^\s*<!--\s*docs-test:\s*skip\b\s*(.*?)\s*-->\s*$")

# blocks of pages that do not carry the skip tag yet: (page, first code line) -> reason
UNTAGGED_SKIPS = {
    ("docs/calibration.md", "from reflectrl.eval.calibration import auroc, brier, ece, reflection_metrics, "
                            "risk_coverage"):
        "a list of calls on the reader's own confidence / correct arrays",
    ("docs/llm.md", "class GenerationEngine(Protocol):"): "an interface signature",
    ("docs/sandbox.md", "from reflectrl.sandbox import run_tests, SandboxPool, sandbox_capabilities"):
        "uses the reader's own batch of (code, tests) pairs",
    ("docs/sandbox.md", "from reflectrl.sandbox import run_tests_batch, batch_supported"):
        "uses the reader's own list of (code, tests) pairs",
    ("docs/integrations.md", "pip install 'reflectrl[verl]'      # verl >= 0.9, tensordict, omegaconf, codetiming"):
        "an install step",
    ("docs/integrations.md", "from reflectrl.integrations.verl import register_with_verl"):
        "needs verl (tests/integrations/ run it where verl is installed)",
    ("docs/integrations.md", "python examples/verl/make_data.py --task text2sql --self-report reflect --out "
                             "data/text2sql   # train/heldout.parquet"):
        "a script of examples/ (tests/integrations/ run it)",
    ("docs/integrations.md", 'python -m verl.trainer.main_ppo --config-path "$PWD/examples/verl" '
                             '--config-name grpo \\'):
        "needs verl's GPU stack and a model",
}

# make targets in the docs: what the test does instead of running them
MAKE_TARGETS = {
    "test": "the test suite this test is part of",
    "test-slow": "the slow tests (make test-slow)",
    "demo": "`reflectrl demo` at its own budget (minutes; its preset has no smaller one): benchmarks/demo_time.py "
            "runs and times it, tests/llm/test_real_model.py runs its LLM half shrunk",
    "docs": "regenerates docs/cli.md, which tests/test_cli.py checks",
}


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page with their language and skip reason."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i, tag = 0, None
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        t = SKIP_TAG.match(lines[i])
        if t:
            tag = t.group(1) or ""
            assert tag, f"{page.name}:{i + 1}: `docs-test: skip` needs a reason"
        elif m:
            indent, lang, start = len(m.group(1)), m.group(2).lower(), i
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                i += 1
            out.append(Block(str(page.relative_to(ROOT)), start + 1, lang, "\n".join(body), tag))
            tag = None
        elif lines[i].strip():
            tag = None
        i += 1
    return out


def first_line(block: Block) -> str:
    return next((l.strip() for l in block.code.splitlines() if l.strip()), "")


# ---------------------------------------------------------------------------------------------- shrink
def value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def setflag(argv: list[str], flag: str, val: str | None = None) -> list[str]:
    """``argv`` with ``flag`` set to ``val`` (a switch when None), before a trailing ``--extra``."""
    head, tail = (argv[:argv.index("--extra")], argv[argv.index("--extra"):]) if "--extra" in argv else (argv, [])
    if flag in head:
        if val is not None:
            head = [*head[:head.index(flag) + 1], val, *head[head.index(flag) + 2:]]
        return [*head, *tail]
    return [*head, flag, *([] if val is None else [val]), *tail]


def dropflag(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    i = argv.index(flag)
    return [*argv[:i], *argv[i + 2:]]


def control_fields(algo: str) -> set[str]:
    from reflectrl.algos import get_algo

    return {f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(get_algo("control", algo).config_cls)}


TINY_CONTROL = {"--num-steps": "16", "--update-epochs": "1", "--num-minibatches": "2", "--learning-starts": "32",
                "--buffer-size": "256", "--log-interval": "64"}


def shrink_train(a: list[str]) -> list[str]:
    """PPO family: 4 envs (unless given) x 16 steps, 2 updates, 1 epoch of 2 minibatches; DQN family: 128 steps,
    learning from step 32. --resume: one more batch than the run has (when a budget is given)."""
    if "--resume" in a:
        if "--total-timesteps" in a:
            cfg = json.loads((Path(value(a, "--resume")) / "config.json").read_text())
            batch = cfg.get("num_envs", 1) * cfg.get("num_steps", 64)
            a = setflag(a, "--total-timesteps", str(cfg["total_timesteps"] + batch))
        return setflag(a, "--no-progress")
    fields = control_fields(value(a, "--algo") or "ppo")
    for flag, val in TINY_CONTROL.items():
        if flag in fields:
            a = setflag(a, flag, val)
    if "--num-steps" in fields:
        envs = value(a, "--num-envs") or "4"
        a = setflag(setflag(a, "--num-envs", envs), "--total-timesteps", str(int(envs) * 16 * 2))
    else:
        a = setflag(a, "--total-timesteps", "128")
    return setflag(setflag(a, "--no-progress"), "--no-tensorboard")


def shrink_compare(a: list[str]) -> list[str]:
    """1 seed, 512 steps per run (4 envs x 64 steps x 2 updates of 1 epoch: enough for episodes to end, so the
    curves have returns), 1 worker, 1 evaluation episode, 100 resamples."""
    for flag, val in (("--seeds", "1"), ("--total-timesteps", "512"), ("--workers", "1"), ("--eval-episodes", "1"),
                      ("--bootstrap-reps", "100")):
        a = setflag(a, flag, val)
    if "--extra" not in a:
        a = [*a, "--extra"]
    return [*a, "--num-envs", "4", "--num-steps", "64", "--update-epochs", "1", "--num-minibatches", "2",
            "--no-tensorboard"]


def shrink_llm_train(a: list[str]) -> list[str]:
    """2 updates of 2 prompts x 2 samples of at most 4 tokens; --resume: one more update than the run has."""
    if "--resume" in a:
        if "--updates" in a:
            done = json.loads((Path(value(a, "--resume")) / "config.json").read_text())["updates"]
            a = setflag(a, "--updates", str(done + 1))
        return setflag(a, "--no-progress")
    for flag, val in (("--updates", "2"), ("--prompts-per-update", "2"), ("--group-size", "2"),
                      ("--max-new-tokens", "4"), ("--eval-problems", "2")):
        a = setflag(a, flag, val)
    return setflag(setflag(a, "--no-progress"), "--no-tensorboard")


def shrink_warmup(a: list[str]) -> list[str]:
    """2 steps of 4 demonstrations, checks on 2 problems, no target accuracy."""
    a = dropflag(a, "--stop-at-accuracy")
    for flag, val in (("--steps", "2"), ("--batch-size", "4"), ("--eval-problems", "2")):
        a = setflag(a, flag, val)
    return setflag(a, "--no-progress")


def shrink_llm_compare(a: list[str]) -> list[str]:
    """1 seed, 2 updates of 2 prompts x 2 samples of at most 4 tokens, 2 evaluation problems, 1 worker; without
    --model, a fresh tiny model (the task recipe's warm-up takes CPU-minutes)."""
    for flag, val in (("--seeds", "1"), ("--updates", "2"), ("--eval-limit", "2"), ("--workers", "1"),
                      ("--bootstrap-reps", "100")):
        a = setflag(a, flag, val)
    if "--model" not in a:
        tiny = Path("docs-test-tiny")
        if not tiny.exists():
            from reflectrl.llm.tiny import init_tiny

            init_tiny(tiny, layers=1, width=32, heads=2, max_positions=256)
        a = setflag(a, "--model", str(tiny))
    if "--extra" not in a:
        a = [*a, "--extra"]
    return [*a, "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "4", "--no-tensorboard"]


AS_WRITTEN = lambda a: a  # noqa: E731  (cheap as documented)
SHRINK = {
    "train": shrink_train,
    "eval": lambda a: setflag(a, "--episodes", "2"),
    "presets": AS_WRITTEN,
    "compare": shrink_compare,
    "plot": AS_WRITTEN,
    "llm init-tiny": AS_WRITTEN,
    "llm warmup": shrink_warmup,
    "llm train": shrink_llm_train,
    "llm eval": lambda a: setflag(a, "--limit", "2"),
    "llm compare": shrink_llm_compare,
    "tasks list": AS_WRITTEN,
    "tasks show": AS_WRITTEN,
    "tasks validate": lambda a: setflag(a, "--split", "heldout"),
    "calibration": lambda a: setflag(a, "--reps", "20"),
    "sandbox capabilities": AS_WRITTEN,
}
PY_SHRINK = [(r"total_timesteps=[\d_]+", "total_timesteps=1024"), (r"\bupdates=[\d_]+", "updates=2")]


def command_key(argv: list[str]) -> str:
    two = " ".join(argv[:2])
    return two if two in SHRINK or argv[0] in ("llm", "tasks", "sandbox") else argv[0]


# ---------------------------------------------------------------------------------------------- run
def newest_run_dir() -> str:
    dirs = [Path(p).parent for p in glob.glob("runs/**/checkpoint.safetensors", recursive=True)]
    assert dirs, "RUN_DIR in a command, but no run directory has been written yet"
    return str(max(dirs, key=lambda d: d.stat().st_mtime))


def substitute(word: str) -> str:
    if word == "RUN_DIR":
        return newest_run_dir()
    if "<time>" in word:
        found = sorted(glob.glob(word.replace("<time>", "*")), key=lambda p: Path(p).stat().st_mtime)
        assert found, f"no directory matches {word}"
        return found[-1]
    return word


def commands(code: str) -> list[str]:
    """The commands of a shell block: continuations joined, comments and ``[optional syntax]`` dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = (shlex.split(re.sub(r"\s\[[^\]]*\]", "", line), comments=True) for line in joined.splitlines())
    return [shlex.join(words) for words in lines if words]




def run_command(line: str, where: str, capsys) -> None:
    words = shlex.split(line, comments=True)
    if not words:
        return
    if words[0] == "make":
        assert len(words) == 2 and words[1] in MAKE_TARGETS, (
            f"{where}: `{line}`: no rule for this make target; add it to MAKE_TARGETS in tests/test_docs.py")
        return
    assert words[0] == "reflectrl", (f"{where}: `{line}`: the docs test runs reflectrl commands only; tag the block "
                                     "`<!-- docs-test: skip REASON -->` or add a rule to tests/test_docs.py")
    argv = [substitute(w) for w in words[1:]]
    key = command_key(argv)
    if "--help" in argv or "-h" in argv:
        shrink = AS_WRITTEN
    else:
        assert key in SHRINK, (f"{where}: `{line}`: the docs test does not know how to shrink `reflectrl {key}`; "
                               "add a rule to SHRINK in tests/test_docs.py or tag the block")
        shrink = SHRINK[key]
    argv = shrink(argv)
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code or 0
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err, f"{where}: `reflectrl {shlex.join(argv)}` exited {rc}:\n{err[-3000:]}"


def run_python(code: str, where: str) -> None:
    shrunk = code
    for pattern, repl in PY_SHRINK:
        shrunk = re.sub(pattern, repl, shrunk)
    assert ".learn(" not in code or shrunk != code, (
        f"{where}: a python example that trains, with no budget PY_SHRINK knows; add a rule to tests/test_docs.py")
    exec(compile(shrunk, where, "exec"), {"__name__": "__docs__"})


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang in RUN_LANGS]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_example_of_the_page_runs(page, tmp_path, monkeypatch, capsys):
    from reflectrl.experiments import runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "_run_cli", in_process_cli)
    for b in runnable(page):
        if b.skip is not None or (b.page, first_line(b)) in UNTAGGED_SKIPS:
            continue
        where = f"{b.page}:{b.line}"
        if b.lang == "python":
            run_python(b.code, where)
        else:
            for line in commands(b.code):
                run_command(line, where, capsys)
    capsys.readouterr()
    if not runnable(page):
        pytest.skip(f"{page.name} has no bash or python blocks")


def test_untagged_skips_match_blocks():
    keys = {(b.page, first_line(b)) for p in PAGES for b in runnable(p)}
    stale = [k for k in UNTAGGED_SKIPS if k not in keys]
    assert not stale, f"UNTAGGED_SKIPS names blocks that no longer exist: {stale}"


def test_the_harness_refuses_what_it_cannot_shrink(capsys):
    with pytest.raises(AssertionError, match="does not know how to shrink `reflectrl sandbox run`"):
        run_command("reflectrl sandbox run --code a.py --tests t.py", "x.md:1", capsys)
    with pytest.raises(AssertionError, match="reflectrl commands only"):
        run_command("pip install reflectrl", "x.md:1", capsys)
    with pytest.raises(AssertionError, match="no rule for this make target"):
        run_command("make bench-speed", "x.md:1", capsys)
    with pytest.raises(AssertionError, match="no budget PY_SHRINK knows"):
        run_python("from reflectrl.control import PPO\nPPO(cfg).learn()", "x.md:1")
    assert shrink_train(["train", "--algo", "dqn"])[-6:] == ["--log-interval", "64", "--total-timesteps", "128",
                                                            "--no-progress", "--no-tensorboard"]
    assert commands("reflectrl a \\\n   --b 1 [--backend ray]   # note\n# only a comment\n") == ["reflectrl a --b 1"]
