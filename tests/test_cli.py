import contextlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reflectrl.cli import main

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "reflectrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def assert_clean_error(proc, pattern):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_train_then_eval_smoke(tmp_path):
    run = tmp_path / "r"
    p = cli("train", "--algo", "ppo", "--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "256",
            "--num-envs", "2", "--num-steps", "64", "--run-dir", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["global_step"] == 256
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["num_envs"] == 2 and cfg["learning_rate"] == 2.5e-4
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 2
    for key in ("global_step", "charts/SPS", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"):
        assert key in recs[-1]
    assert any("charts/episodic_return" in r for r in recs)
    assert list((run / "tb").glob("events.out.tfevents.*"))
    e = cli("eval", str(run), "--episodes", "3", "--json")
    assert e.returncode == 0, e.stderr
    out = json.loads(e.stdout.strip().splitlines()[-1])
    rets = out["returns"]
    assert out["episodes"] == len(rets) == 3 and all(r >= 1 and r == int(r) for r in rets)  # CartPole: +1 a step
    assert out["mean"] == pytest.approx(sum(rets) / 3) and out["std"] == pytest.approx(float(np.std(rets)))
    again = cli("eval", str(run), "--episodes", "3", "--json")
    assert json.loads(again.stdout.strip().splitlines()[-1])["returns"] == rets  # same seed, same episodes
    # resume a finished run to a larger budget
    r = cli("train", "--resume", str(run), "--total-timesteps", "384", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_preset_values_and_explicit_override(tmp_path):
    run = tmp_path / "p"
    p = cli("train", "--preset", "LunarLander-v3", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
            "--total-timesteps", "128", "--run-dir", str(run), "--no-progress")
    assert p.returncode == 0, p.stderr
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["env_id"] == "LunarLander-v3" and cfg["gamma"] == 0.999 and cfg["num_envs"] == 2


@pytest.mark.parametrize("args,pattern", [
    (["train", "--env-id", "NoSuchEnv-v0"], "unknown Gymnasium env id"),
    (["train", "--num-envs", "4", "--num-minibatches", "3"], "not divisible"),
    (["train", "--learning-rate", "-0.1"], "learning-rate must be positive"),
    (["train", "--preset", "NoSuchPreset"], "unknown preset"),
    (["train", "--algo", "nope"], "unknown --algo"),
    (["train", "--resume", "/nonexistent/run"], "does not exist"),
    (["eval", "/nonexistent/run"], "does not exist"),
])
def test_bad_input_gives_one_clear_error(args, pattern):
    assert_clean_error(cli(*args), pattern)


def test_corrupt_checkpoint_gives_one_clear_error(tmp_path):
    run = tmp_path / "c"
    assert cli("train", "--env-id", "CartPole-v1", "--total-timesteps", "128", "--num-envs", "2", "--num-steps", "64",
               "--run-dir", str(run), "--no-progress").returncode == 0
    (run / "checkpoint.safetensors").write_bytes(b"garbage")
    assert_clean_error(cli("eval", str(run)), "corrupt")
    assert_clean_error(cli("train", "--resume", str(run)), "corrupt")
    (run / "config.json").write_text("{not json")
    assert_clean_error(cli("eval", str(run)), "corrupt")


def gen_cli_docs_commands():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.COMMANDS


def test_docs_cli_lists_every_command_and_flag_of_the_help(capsys):
    doc = (ROOT / "docs" / "cli.md").read_text()
    commands = gen_cli_docs_commands()
    listed = {tuple(c) for c in commands}
    for group in (["llm"], ["tasks"], ["sandbox"]):  # every subcommand of a group is in the generator's list
        assert main([*group, "--help"]) == 0
        text = capsys.readouterr().out
        subs = re.findall(r"^  ([a-z][a-z-]+)\s", text, re.M) or re.findall(r"\{([a-z,-]+)\}", text)[0].split(",")
        missing = [s for s in subs if (*group, s) not in listed]
        assert not missing, f"scripts/gen_cli_docs.py lacks {group} {missing}"
    for cmd in commands:
        assert f"## `{' '.join(['reflectrl', *cmd])}`" in doc, f"docs/cli.md lacks {cmd}; run `make docs`"
        try:
            rc = main([*cmd, "--help"])
        except SystemExit as exc:
            rc = exc.code
        assert rc in (0, None), cmd
        flags = set(re.findall(r"--[a-z][a-z0-9-]+", capsys.readouterr().out))
        missing = sorted(f for f in flags if f not in doc)
        assert not missing, f"docs/cli.md lacks {missing} of {cmd}; regenerate it with `make docs`"


# ------------------------------------------------------------------------------------------------
# A user's bad day: one `error: ...` line, exit status 2, no traceback, nothing lost or overwritten.
# In-process through reflectrl.cli.main (fast); a few need a real process (pipes). Preemption, numerical faults
# and the documented commands have their own files (test_preemption.py, test_nonfinite.py, test_docs.py).
SMALL = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
         "--update-epochs", "1", "--no-progress", "--no-tensorboard"]


def one_error(capsys, argv, pattern, code=2):
    rc = main(list(argv))
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == code, err
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from reflectrl.llm.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny") / "m", layers=1, width=32, heads=2, max_positions=128)


def llm_train(tiny, run, updates=2, *extra):
    return ["llm", "train", "--task", "arith", "--model", str(tiny), "--prompts-per-update", "2", "--group-size",
            "2", "--max-new-tokens", "3", "--updates", str(updates), "--run-dir", str(run), "--no-progress",
            "--no-tensorboard", *extra]


def config(run):
    return json.loads((run / "config.json").read_text())


# 1. stale config.json ---------------------------------------------------------------------------
def test_a_new_run_rewrites_what_a_run_without_checkpoint_left(tmp_path, capsys, tiny):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "control", "algo": "dqn", "total_timesteps": 1}))
    (run / "metrics.jsonl").write_text('{"update": 1, "global_step": 999}\n' * 3)
    assert main(["train", *SMALL, "--total-timesteps", "128", "--run-dir", str(run)]) == 0
    assert config(run)["algo"] == "ppo" and config(run)["total_timesteps"] == 128
    assert [json.loads(l)["global_step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [128]
    assert main(["train", "--resume", str(run), "--total-timesteps", "384", "--no-progress"]) == 0
    assert config(run)["total_timesteps"] == 384
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0  # a plain resume keeps it
    assert config(run)["total_timesteps"] == 384
    llm = tmp_path / "g"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps({"kind": "llm", "algo": "dapo", "updates": 1}))
    assert main(llm_train(tiny, llm, 1)) == 0
    assert config(llm)["algo"] == "grpo" and config(llm)["updates"] == 1
    assert main(["llm", "train", "--resume", str(llm), "--updates", "3", "--no-progress"]) == 0
    assert config(llm)["updates"] == 3
    assert main(["llm", "train", "--resume", str(llm), "--no-progress"]) == 0
    assert config(llm)["updates"] == 3 and len((llm / "metrics.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()


# 2. output paths --------------------------------------------------------------------------------
BAD_DIRS = [("/proc/reflectrl-x", "cannot be written"), ("/sys/reflectrl-x", "cannot be written"),
            ("FILE", "is a file, not a directory"), ("FILE/sub", "is under .*, which is a file")]


@pytest.mark.parametrize("path,why", BAD_DIRS)
@pytest.mark.parametrize("argv", [
    ["train", *SMALL, "--total-timesteps", "128", "--run-dir", "{}"],
    ["llm", "train", "--task", "arith", "--model", "/no/model", "--run-dir", "{}"],
    ["llm", "init-tiny", "{}"],
    ["llm", "warmup", "--model", "/no/model", "--task", "arith", "--out", "{}"],
    ["compare", "--methods", "ppo", "--env-ids", "CartPole-v1", "--total-timesteps", "64", "--out", "{}"],
], ids=["train", "llm-train", "init-tiny", "warmup", "compare"])
def test_unwritable_output_directories(tmp_path, capsys, argv, path, why):
    (tmp_path / "FILE").write_text("x")
    path = path.replace("FILE", str(tmp_path / "FILE"))
    one_error(capsys, [a.replace("{}", path) for a in argv], rf"{re.escape(path)} {why}")


@pytest.mark.parametrize("out,pattern", [
    ("/proc/reflectrl-x.png", "its directory /proc cannot be written"),
    ("FILE/x.png", "its directory .*FILE is a file"),
    ("x.jpgg", r"matplotlib cannot write \.jpgg files; use one of .*\.png"),
    ("DIR", "is a directory; give a file name"),
])
def test_plot_out_is_checked_before_drawing(tmp_path, capsys, out, pattern):
    (tmp_path / "FILE").write_text("x")
    out = out.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path))
    one_error(capsys, ["plot", str(tmp_path), "--out", out], pattern)


def test_a_failed_check_leaves_no_directory_behind(tmp_path, capsys):
    one_error(capsys, ["train", *SMALL, "--learning-rate", "-1", "--run-dir", str(tmp_path / "a" / "b")],
              "learning-rate")
    assert not (tmp_path / "a").exists()


# 3. seeds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", str(2**63)])
@pytest.mark.parametrize("argv", [
    ["train", *SMALL], ["train", "--algo", "dqn", "--no-progress"], ["eval", "/no/run"],
    ["llm", "train", "--task", "arith", "--model", "/no/model"], ["llm", "eval", "/no/model"],
    ["llm", "init-tiny", "/no/dir"], ["llm", "warmup", "--model", "/no/model", "--out", "/no/dir"],
], ids=["train", "dqn", "eval", "llm-train", "llm-eval", "init-tiny", "warmup"])
def test_seeds_outside_the_range_are_refused(capsys, argv, seed):
    one_error(capsys, [*argv, "--seed", seed], rf"--seed must be an integer in \[0, 2\^63 - 1\], got {seed}")


# 4. wrong targets -------------------------------------------------------------------------------
def fake_run(d, kind):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"kind": kind, "algo": "ppo" if kind == "control" else "grpo"}))
    (d / "checkpoint.safetensors").write_bytes(b"x")
    return d


def test_each_front_end_names_the_other_for_its_runs(tmp_path, capsys):
    llm, ctl = fake_run(tmp_path / "llm", "llm"), fake_run(tmp_path / "ctl", "control")
    one_error(capsys, ["eval", str(llm)], rf"{llm} is an LLM run directory: evaluate it with `reflectrl llm eval")
    one_error(capsys, ["llm", "eval", str(ctl)], rf"{ctl} is a control run directory: evaluate it with `reflectrl eval")
    one_error(capsys, ["train", "--resume", str(llm)], rf"continue it with `reflectrl llm train --resume {llm}`")
    one_error(capsys, ["llm", "train", "--resume", str(ctl)], rf"continue it with `reflectrl train --resume {ctl}`")


@pytest.mark.parametrize("argv", [
    ["llm", "train", "--task", "arith", "--model", "/no/model", "--device", "cuda"],
    ["llm", "eval", "/no/model", "--device", "cuda:0"],
    ["llm", "warmup", "--model", "/no/model", "--out", "/no/dir", "--device", "cuda"],
], ids=["train", "eval", "warmup"])
def test_cuda_without_cuda_is_one_clear_error(capsys, monkeypatch, argv):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one_error(capsys, argv, r"torch\.cuda\.is_available\(\) is False")


def test_an_unknown_device_is_one_clear_error(capsys):
    one_error(capsys, ["llm", "eval", "/no/model", "--device", "gpu0"], "'gpu0' is not a torch device")


# 5. no silent overwrites ------------------------------------------------------------------------
def test_init_tiny_and_warmup_refuse_an_occupied_directory_unless_forced(tmp_path, capsys, tiny):
    out = tmp_path / "m"
    assert main(["llm", "init-tiny", str(out), "--layers", "1", "--width", "16", "--heads", "2"]) == 0
    before = (out / "model.safetensors").read_bytes()
    (out / "warmup.json").write_text("{}")  # as if a warm-up had been written here
    one_error(capsys, ["llm", "init-tiny", str(out), "--seed", "3"], "is not empty; .*add --force")
    assert (out / "model.safetensors").read_bytes() == before
    assert main(["llm", "init-tiny", str(out), "--layers", "1", "--width", "16", "--heads", "2", "--seed", "3",
                 "--force"]) == 0
    assert (out / "model.safetensors").read_bytes() != before and not (out / "warmup.json").exists()
    warm = tmp_path / "w"
    args = ["llm", "warmup", "--model", str(tiny), "--task", "arith", "--out", str(warm), "--steps", "1",
            "--batch-size", "2", "--eval-problems", "1", "--no-progress"]
    assert main(args) == 0
    first = (warm / "warmup.json").read_text()
    one_error(capsys, args, rf"--out {warm} is not empty; .*add --force")
    assert (warm / "warmup.json").read_text() == first
    assert main([*args, "--force", "--seed", "1"]) == 0
    assert json.loads((warm / "warmup.json").read_text())["config"]["seed"] == 1
    capsys.readouterr()


# 6. interrupts that are not runs ----------------------------------------------------------------
def interrupt(*a, **kw):
    raise KeyboardInterrupt


@pytest.mark.parametrize("target,argv", [
    ("reflectrl.llm.warmup.warmup", ["llm", "warmup", "--model", "m", "--out", "/tmp/reflectrl-none"]),
    ("reflectrl.cli.tasks.validate", ["tasks", "validate", "arith"]),
    ("reflectrl.control.evaluate.evaluate", ["eval", "RUN"]),
    ("reflectrl.llm.evaluate.evaluate", ["llm", "eval", "RUN"]),
], ids=["warmup", "tasks-validate", "eval", "llm-eval"])
def test_ctrl_c_outside_training_does_not_suggest_resume(capsys, monkeypatch, target, argv):
    monkeypatch.setattr(target, interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted", err


# 7. resume rules, the same on both front ends ---------------------------------------------------
def test_resume_rules_on_both_front_ends(tmp_path, capsys, tiny):
    ctl, llm = tmp_path / "c", tmp_path / "g"
    assert main(["train", *SMALL, "--total-timesteps", "256", "--run-dir", str(ctl)]) == 0
    assert main(llm_train(tiny, llm, 2)) == 0
    for cmd, run, flag, other in ((["train"], ctl, "--total-timesteps", "dqn"), (["llm", "train"], llm, "--updates",
                                                                                   "dapo")):
        one_error(capsys, [*cmd, "--resume", str(run), "--algo", other], f"is a run of --algo .*drop --algo {other}")
        one_error(capsys, [*cmd, "--resume", str(run), "--learning-rate", "0.1"],
                  rf"--resume continues a run as it was configured; {flag}, .* are the flags it takes "
                  r"\(got --learning-rate 0.1\)")
        one_error(capsys, [*cmd, "--resume", str(run), flag, "1"], rf"{flag} 1 is below what the run has done")
    one_error(capsys, ["train", "--resume", str(ctl), "--preset", "LunarLander-v3"], "--preset cannot be combined")
    one_error(capsys, ["llm", "train", "--resume", str(llm), "--set", "digits=1"], "--set cannot be combined")
    # a moved base model: a plain resume says how to continue; --model continues (and is remembered)
    moved = tmp_path / "moved"
    shutil.copytree(tiny, moved)
    raw = config(llm)
    raw["model"] = str(tmp_path / "gone")
    (llm / "config.json").write_text(json.dumps(raw))
    one_error(capsys, ["llm", "train", "--resume", str(llm), "--updates", "3"],
              rf"the base model of {llm}, .*gone, does not exist \(moved\?\): give its new place with "
              rf"`reflectrl llm train --resume {llm} --model PATH`")
    assert main(["llm", "train", "--resume", str(llm), "--updates", "3", "--model", str(moved), "--no-progress"]) == 0
    assert config(llm)["model"] == str(moved) and config(llm)["updates"] == 3
    assert main(["llm", "train", "--resume", str(llm), "--updates", "4", "--no-progress"]) == 0
    assert [json.loads(l)["update"] for l in (llm / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    capsys.readouterr()


# 9. output hygiene ------------------------------------------------------------------------------
def test_progress_bar_goes_to_stderr_and_stdout_is_one_json_line(tmp_path, capsys):
    flags = [f for f in SMALL if f != "--no-progress"]
    assert main(["train", *flags, "--total-timesteps", "128", "--run-dir", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and json.loads(out)["global_step"] == 128


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["tasks", "list"]])
def test_a_closed_stdout_pipe_is_not_an_error(args):
    p = subprocess.Popen([sys.executable, "-m", "reflectrl.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()  # `| head` that has read what it wanted
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and "BrokenPipe" not in err and "Traceback" not in err, err


def test_warnings_are_one_line_without_source(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", *SMALL, "--total-timesteps", "128", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--total-timesteps", "256", "--no-progress"]) == 0
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("warning: changing --total-timesteps from 128 to 256 moves the "
                                               "schedule of --anneal-lr"), err
    assert main(["train", "--algo", "dqn", "--total-timesteps", "128", "--run-dir", str(tmp_path / "d"),
                 "--no-progress", "--no-tensorboard"]) == 0
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert err == ["warning: --total-timesteps 128 is not above --learning-starts 10000: DQN only fills its replay "
                   "buffer and never trains"], err


def test_exp_name_cannot_leave_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *SMALL, "--total-timesteps", "128", "--exp-name", "a/../../b"]) == 0
    run = Path(json.loads(capsys.readouterr().out)["run_dir"]).resolve()
    assert run.parent == (tmp_path / "runs").resolve() and (run / "checkpoint.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("n", ["0", "-1"])
def test_tasks_show_needs_a_positive_n(capsys, n):
    one_error(capsys, ["tasks", "show", "arith", "-n", n], f"-n must be at least 1, got {n}")


def test_task_options_reach_train_and_eval(tmp_path, capsys, tiny):
    run = tmp_path / "g"
    assert main(llm_train(tiny, run, 1, "--set", "n_heldout=7", "--set", "digits=1")) == 0
    assert config(run)["task_options"] == ["n_heldout=7", "digits=1"]
    samples = [json.loads(l) for l in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(re.fullmatch(r"\d[+-]\d=", s["transcript"][0][1]) for s in samples), samples[0]
    capsys.readouterr()
    assert main(["llm", "eval", str(run), "--json", "--max-new-tokens", "2"]) == 0  # the run's options
    assert json.loads(capsys.readouterr().out)["n"] == 7
    assert main(["llm", "eval", str(run), "--json", "--max-new-tokens", "2", "--set", "n_heldout=3"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 3
    one_error(capsys, llm_train(tiny, tmp_path / "h", 1, "--set", "digits"), "--set expects KEY=VALUE")
    one_error(capsys, llm_train(tiny, tmp_path / "h", 1, "--set", "nope=1"), "task 'arith' has no option nope")


def _flags_without_help(text: str) -> list[str]:
    """The flags of a ``--help`` screen (tyro's boxes or argparse's list) whose line says nothing but a default."""
    import re

    lines = [re.sub(r"^[\s│|]+|[\s│|]+$", "", line) for line in text.splitlines()]
    bare = lambda s: re.sub(r"\((default|required|fixed to)[^)]*\)", "", s).strip()  # noqa: E731
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^(?:-\w, )?(--[a-z][\w-]*(?:[ ,]+--[a-z][\w-]*)*)(\s+[A-Z{][^\s]*)?(.*)$", line)
        if not m:
            continue
        after = lines[i + 1] if i + 1 < len(lines) else ""
        if not bare(m.group(3)) and (after.startswith("-") or not bare(after) or set(bare(after)) <= set("─╰╯-")):
            out.append(m.group(1))
    return out


def test_every_flag_has_help_text_and_every_command_is_listed(capsys, monkeypatch):
    """``reflectrl --help`` names every command and subcommand; no flag of ``train`` (every control algo), ``llm
    train`` (every LLM algo), ``llm eval``, ``llm warmup`` or ``llm export`` goes without help text."""
    from reflectrl.algos import algo_names
    from reflectrl.cli.llm import COMMANDS as LLM_COMMANDS

    monkeypatch.setenv("COLUMNS", "250")
    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    for word in (*LLM_COMMANDS, "run", "capabilities", "list", "show", "validate", "calibration", "demo"):
        assert word in top, word
    screens = [["train", "--algo", a] for a in algo_names("control")] + \
        [["llm", "train", "--algo", a] for a in algo_names("llm")] + [["llm", c] for c in ("eval", "warmup", "export")]
    for argv in screens:
        with contextlib.suppress(SystemExit):
            main([*argv, "--help"])
        text = capsys.readouterr().out
        assert "--" in text and _flags_without_help(text) == [], (argv, _flags_without_help(text))
    assert _flags_without_help("│ --adam-beta1 FLOAT     (default: 0.9) │\n│ --lr FLOAT  the rate (default: 1) │") == \
        ["--adam-beta1"]  # the check finds a bare flag


def _defined_flags(text: str) -> set[str]:
    """The flags a help screen defines (argparse's lines or tyro's boxes), not those its texts mention."""
    out: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"^(?:  |│ )(?:-h, )?(--[a-z][\w-]*(?:, --[a-z][\w-]*)*)", line)
        if m:
            out.update(m.group(1).split(", "))
    return out


def test_llm_train_help_groups_the_flags_tyro_takes(capsys, monkeypatch):
    """Common flags first, a method's own under its name, then the rest by what they set; the flags are tyro's, no
    more and no fewer, plus the command's own (--recipe, --resume, --set)."""
    import tyro

    from reflectrl.algos import algo_names, get_algo

    monkeypatch.setenv("COLUMNS", "250")
    for name in algo_names("llm"):
        assert main(["llm", "train", "--algo", name, "--help"]) == 0
        text = capsys.readouterr().out
        algo = get_algo("llm", name)
        with contextlib.suppress(SystemExit):
            tyro.cli(algo.config_cls, args=["--help"], default=algo.config(), prog="p")
        assert _defined_flags(text) == _defined_flags(capsys.readouterr().out) | {"--recipe", "--resume", "--set"}, name
        heads = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ,]*options:", line)]
        assert heads[0] == "common options" and heads[-4:-1] == ["rollout options", "loss and advantage options",
                                                                 "optimizer and update options"], heads
        common = text[text.index("common options:"):text.index(heads[1] + ":")]
        assert all(f in common for f in ("--task ", "--model ", "--updates ", "--cpu-time-limit-s ", "--recipe "))
        own = [h for h in heads if h == f"{name} options"]
        if name == "rlcr":
            assert own and "--rlcr-credit" in text[text.index("rlcr options:"):text.index("rollout options:")]
        assert len(own) == (heads[1] == f"{name} options") and "other options" not in heads, heads


def test_control_train_help_groups_the_flags_tyro_takes(capsys, monkeypatch):
    """``reflectrl train --help`` as ``llm train``'s: common flags first, a method's own under its name, then PPO's or
    DQN's by what they set; tyro's flags, no more and no fewer, plus the command's own (--preset, --resume)."""
    import tyro

    from reflectrl.algos import algo_names, get_algo

    monkeypatch.setenv("COLUMNS", "250")
    for name in algo_names("control"):
        assert main(["train", "--algo", name, "--help"]) == 0
        text = capsys.readouterr().out
        algo = get_algo("control", name)
        with contextlib.suppress(SystemExit):
            tyro.cli(algo.config_cls, args=["--help"], default=algo.config_cls(), prog="p")
        tyro_flags = _defined_flags(capsys.readouterr().out)
        assert _defined_flags(text) == tyro_flags | {"--algo", "--preset", "--resume"}, name
        heads = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][a-z ,-]*options:", line)]
        assert heads[0] == "common options" and "other options" not in heads, heads
        common = text[text.index("common options:"):text.index(heads[1] + ":")]
        assert all(f in common for f in ("--env-id ", "--total-timesteps ", "--seed ", "--preset ")), name
        assert ("loss and update options" in heads) == ("--clip-coef" in tyro_flags), heads
        assert ("replay and exploration options" in heads) == ("--buffer-size" in tyro_flags), heads
        own = [h for h in heads if h == f"{name} options"]
        assert len(own) == (heads[1] == f"{name} options"), heads
        if name in ("refgrpo-seed", "gear-seed", "exgrpo-seed"):
            assert own, heads
    assert main(["train", "--preset", "LunarLander-v3", "--help"]) == 0
    assert "--env-id STR" in (out := capsys.readouterr().out) and "(default: LunarLander-v3)" in out


def test_a_config_field_without_a_docstring_is_a_flag_without_help(monkeypatch):
    """The grouped help takes each flag's text from its field's docstring, never from its name, so the help check
    above sees a field that lacks one."""
    from dataclasses import dataclass

    from reflectrl.cli import train_help
    from reflectrl.control.config import PPOConfig

    @dataclass
    class Undocumented(PPOConfig):
        bare_knob: int = 3

    class Algo:
        name, description = "ppo", "test"

    text = train_help.control_train_help(Algo(), Undocumented(), ["ppo"], [])
    assert "--bare-knob" in _flags_without_help(text) and "--clip-coef" not in _flags_without_help(text)


def test_demo_refuses_empty_budgets_before_it_trains(capsys):
    for argv in (["--llm-problems", "0"], ["--llm-updates", "-1"], ["--threads", "0"]):
        assert main(["demo", *argv, "--out", "unused"]) == 2
        assert "error: --llm-updates must be >= 0" in capsys.readouterr().err
