"""Short runs of every algo at fixed seeds whose ``metrics.jsonl`` are kept as golden files.

``python tests/golden/runs.py --record`` rewrites the golden files (only when a change of behaviour
is meant, and documented); ``tests/test_golden.py`` reruns each and asserts the records are equal,
bit for bit, timing fields aside.

Bit for bit holds on one kind of CPU: PyTorch picks its CPU kernels by instruction set (AVX2, AVX-512), and the
transformer's kernels give different last bits on each, which sampling then turns into different rollouts. The
runs here therefore use PyTorch's AVX2 kernels on every x86-64 CPU (``ATEN_CPU_CAPABILITY=avx2``, set before
torch is imported: this script re-executes itself with it). That is not all of it: MKL, which PyTorch's matrix
products go through, picks its own code path by CPU, and on CPUs with AMX (Intel Sapphire Rapids and later) the
last bits differ again, whatever MKL_CBWR says. So there is one set of files per kind of CPU they were recorded
on: this folder's (AVX2 and AVX-512 CPUs without AMX) and ``amx/`` (with AMX), and a run must equal one of them.
``--record NAME --set amx`` rewrites a set's file; a documented change of behaviour re-records every set it can
and removes the files of the sets it cannot. A run with no file for this CPU's kind (:func:`cpu_set`) is skipped
on it, with the reason: the LLM method runs (refgrpo, rlcr, gear, exgrpo and the seeds' LLM forms) have only the
default set so far.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PPO_ARGS = ["--env-id", "CartPole-v1", "--num-envs", "4", "--num-steps", "32", "--total-timesteps", "512",
            "--update-epochs", "2", "--seed", "3"]
GEAR_ARGS = PPO_ARGS + ["--seed-group-size", "2", "--gear-distill-epochs", "2"]
DQN_ARGS = ["--env-id", "CartPole-v1", "--total-timesteps", "800", "--learning-starts", "200", "--buffer-size", "500",
            "--log-interval", "200", "--target-network-frequency", "50", "--train-frequency", "4", "--batch-size", "32",
            "--seed", "3"]
CONTROL = {
    "ppo": PPO_ARGS,
    "refgrpo-seed": PPO_ARGS,
    "gear-seed": GEAR_ARGS,
    "gear-seed-rank": GEAR_ARGS + ["--gear-rank-coef", "0.5"],
    "exgrpo-seed": PPO_ARGS + ["--refl-min-memory", "4"],
    "dqn": DQN_ARGS,
    "exgrpo-seed-dqn": DQN_ARGS + ["--refl-every", "100", "--refl-min-memory", "4"],
}
LLM = {"grpo": [], "drgrpo": [], "dapo": [], "refgrpo": ["--max-new-tokens", "10"], "rlcr": [], "gear": [],
       "exgrpo": ["--exgrpo-start-rate", "0.1"],
       "refgrpo-balanced": ["--max-new-tokens", "10", "--refgrpo-reward", "balanced", "--refgrpo-credit", "split"],
       "rlcr-rank": ["--rlcr-calibration", "rank", "--rlcr-credit", "split"],
       "llm-refgrpo-seed": [], "llm-gear-seed": [], "llm-exgrpo-seed": ["--refl-min-memory", "4"]}
LLM_ARGS = ["--task", "golden-arith", "--updates", "3", "--prompts-per-update", "4", "--group-size", "4",
            "--max-new-tokens", "6", "--learning-rate", "1e-3", "--seed", "2", "--gen-batch", "8",
            "--reward-workers", "0", "--minibatches", "2"]
REAL_ARGS = ["--model", "smollm2-135m-instruct", "--task", "arith", "--set", "ops=+", "--lora-r", "16",
             "--prompts-per-update", "8", "--grad-accum", "4", "--threads", "1", "--updates", "3", "--seed", "3",
             "--reward-workers", "0"]
REAL = {"real-grpo": ["--algo", "grpo"],
        "real-rlcr": ["--algo", "rlcr", "--prompts-per-update", "2"]}
"""The real model's golden runs (SmolLM2-135M-Instruct, LoRA 16, 3 updates, one thread; slow: ``tests/llm/
test_real_golden.py``). They are compared within tolerances, not bit for bit: the defaults that follow from a chat
model may change their numbers within float32 rounding (and what sampling makes of it)."""
ALGO_NAME = {"gear-seed-rank": "gear-seed", "llm-refgrpo-seed": "refgrpo-seed", "llm-gear-seed": "gear-seed",
             "llm-exgrpo-seed": "exgrpo-seed", "refgrpo-balanced": "refgrpo", "rlcr-rank": "rlcr"}


def is_timing(key: str) -> bool:
    """Fields that measure time, not behaviour."""
    return key.startswith("time/") or key in ("charts/SPS", "charts/samples_per_s", "charts/tokens_per_s")


def strip(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in recs]


def register_golden_task() -> None:
    """``golden-arith``: the arith task on one-digit operands, which a tiny model half-learns in seconds."""
    from reflectrl.tasks.arith import ArithTask
    from reflectrl.tasks.base import TASKS, register_task

    if "golden-arith" not in TASKS:
        register_task("golden-arith")(lambda **kw: ArithTask(digits=1, n_train=100, n_heldout=20, **kw))


SELF_REPORT = {"refgrpo": "reflect", "refgrpo-balanced": "reflect", "rlcr": "confidence", "rlcr-rank": "confidence"}
"""The runs whose model is warmed up with that self-report turn in its demonstrations (so the method has reports
to shape)."""


def tiny_model(tmp: Path, self_report: str = "off") -> Path:
    """A tiny random-init model, briefly warmed up so that rewards vary within groups (and, with ``self_report``,
    its demonstrations end with that self-report turn)."""
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup

    register_golden_task()
    warm = tmp / ("warm" if self_report == "off" else f"warm-{self_report}")
    if not (warm / "config.json").exists():
        base = tmp / "tiny"
        if not (base / "config.json").exists():
            init_tiny(base, layers=1, width=32, heads=2, max_positions=128, seed=0)
        warmup(WarmupConfig(model=str(base), task="golden-arith", out=str(warm), steps=150, batch_size=32,
                            learning_rate=3e-3, max_new_tokens=6, progress=False, self_report=self_report))
    return warm


def run(name: str, tmp: Path) -> list[dict[str, Any]]:
    """Train one golden run in ``tmp`` through the CLI; return its metrics records."""
    from reflectrl.cli import main
    from reflectrl.runlog import read_metrics

    run_dir = tmp / name
    common = ["--run-dir", str(run_dir), "--no-progress", "--no-tensorboard"]
    if name in REAL:
        argv = ["llm", "train", *REAL_ARGS, *REAL[name], *common, "--no-export-model", "--sample-interval", "0"]
    elif name in LLM:
        model = tiny_model(tmp, SELF_REPORT.get(name, "off"))
        argv = ["llm", "train", "--algo", ALGO_NAME.get(name, name), "--model", str(model), *LLM_ARGS, *LLM[name], *common,
                "--no-export-model", "--sample-interval", "0"]
    else:
        argv = ["train", "--algo", ALGO_NAME.get(name, name), *CONTROL[name], *common]
    rc = main(argv)
    if rc != 0:
        raise RuntimeError(f"golden run {name} failed ({rc}): {' '.join(argv)}")
    return strip(read_metrics(run_dir / "metrics.jsonl"))


NAMES = [*CONTROL, *LLM]
KERNELS = {"ATEN_CPU_CAPABILITY": "avx2"}


def kernels_available() -> str | None:
    """None where the AVX2 kernels the golden files were recorded with run here; else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the golden files are recorded with x86-64 AVX2 kernels; this CPU is {platform.machine()}"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return None if " avx2" in flags else "the golden files are recorded with AVX2 kernels; this CPU has no AVX2"


def cpu_set() -> str:
    """The set this CPU's runs are expected to equal: ``"amx"`` on a CPU with AMX, else ``""``."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return "amx" if " amx_tile" in flags else ""


def dump(names: list[str], out: Path) -> None:
    """Run ``names`` and write each one's records to ``out/NAME.jsonl`` (a failed run: ``out/NAME.error``)."""
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            try:
                recs = run(name, Path(d))
            except Exception as e:  # reported by the test of that name
                (out / f"{name}.error").write_text(f"{type(e).__name__}: {e}")
                continue
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def dump_fresh(names: list[str], out: Path, timeout: float) -> Any:
    """``--dump`` of ``names`` into ``out`` in a fresh process at one thread with the kernels the files were recorded
    with (what the golden tests compare); the finished process."""
    import subprocess

    env = {**os.environ, **KERNELS, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, __file__, "--dump", str(out), *names], env=env, capture_output=True,
                          text=True, timeout=timeout)


SETS = {"": HERE, "amx": HERE / "amx"}
"""The recorded sets: name -> folder (``""``: this folder)."""
ALL = [*NAMES, *REAL]
"""Every run ``--record`` and ``--dump`` know; ``--record`` alone records :data:`NAMES` (the real ones by name)."""


def golden_path(name: str, which: str = "") -> Path:
    return SETS[which] / f"{name}.jsonl"


def load(name: str, which: str = "") -> list[dict[str, Any]]:
    return [json.loads(line) for line in golden_path(name, which).read_text().splitlines() if line.strip()]


def load_sets(name: str) -> dict[str, list[dict[str, Any]]]:
    """Every recorded set's records of ``name`` (set name -> records), the sets without a file left out."""
    return {w: load(name, w) for w in SETS if golden_path(name, w).is_file()}


def diff(name: str, tmp: Path) -> dict[str, int]:
    """Keys whose values differ from the closest recorded set (with the number of records each differs in)."""
    got = run(name, tmp)
    best: dict[str, int] | None = None
    for want in load_sets(name).values():
        out: dict[str, int] = {}
        if len(got) != len(want):
            out["<records>"] = abs(len(got) - len(want))
        for g, w in zip(got, want):
            for k in set(g) | set(w):
                if g.get(k, "<absent>") != w.get(k, "<absent>"):
                    out[k] = out.get(k, 0) + 1
        if best is None or sum(out.values()) < sum(best.values()):
            best = out
    return best if best is not None else {"<no golden file>": 1}


if __name__ == "__main__":
    import tempfile

    if any(os.environ.get(k) != v for k, v in KERNELS.items()):  # before torch is imported
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **KERNELS})
    if "--dump" in sys.argv:
        i = sys.argv.index("--dump")
        dump(sys.argv[i + 2:] or NAMES, Path(sys.argv[i + 1]))
        sys.exit(0)
    if "--diff" in sys.argv:
        which = [a for a in sys.argv[1:] if a != "--diff"] or NAMES
        with tempfile.TemporaryDirectory() as d:
            for name in which:
                print(name, diff(name, Path(d)), flush=True)
        sys.exit(0)
    if "--record" not in sys.argv:
        sys.exit("usage: python tests/golden/runs.py --record [--set SET] [NAME ...] | --diff [NAME ...] | "
                 "--dump DIR [NAME ...]")
    args = [a for a in sys.argv[1:] if a != "--record"]
    target = ""
    if "--set" in args:
        i = args.index("--set")
        target = args[i + 1]
        del args[i:i + 2]
        if target not in SETS:
            sys.exit(f"unknown set {target!r}; the sets are {', '.join(repr(k) for k in SETS)}")
    which = args or NAMES
    if unknown := [n for n in which if n not in ALL]:
        sys.exit(f"unknown golden run(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    SETS[target].mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in which:
            recs = run(name, Path(d))
            golden_path(name, target).write_text("".join(json.dumps(r) + "\n" for r in recs))
            print(f"recorded {name} ({target or 'default'} set): {len(recs)} records")

