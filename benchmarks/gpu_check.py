"""A short check of the LLM front end's GPU path: CUDA generation and training, the methods on the GPU, resume,
evaluation, torchrun, nccl, and throughput on a larger model. Each check records whether it held, its time and
what it measured; nothing here asserts a speed.

    python benchmarks/gpu_check.py --out runs/bench/gpu_check --json-out benchmarks/results/gpu_check.json

The checks (``--device cuda`` by default; ``--device cpu`` runs the same script on the CPU, with gloo):

- ``warmup``: a tiny model (``llm init-tiny``) warmed up on arith on the device, with every self-report;
- ``cpu_match``: the warmed-up model loaded on the CPU and on the device (float32): the log-probs of fixed token
  sequences, and the weights after one AdamW step on their mean, compared element by element;
- ``train``: GRPO on arith on the device; ``repeat``: the same command again, compared record by record with the
  timing fields left out (whether the device run is bitwise repeatable); ``resume``: the run continued for two
  more updates; ``eval``: ``llm eval`` on the device;
- ``method:NAME``: each self-assessment method for a few updates on the device (their heads, predictors and
  buffers must follow the policy's device); ``rag``: rlcr's per-step form on the multi-turn search task;
- ``torchrun``: ``torchrun --nproc-per-node N`` (N the visible GPUs; one process skips the collectives);
  ``torchrun_too_many``: one process more than there are GPUs must stop with one error line;
  ``nccl_collectives``: :class:`reflectrl.llm.distributed.Dist`'s collectives (sums, gradient buckets,
  broadcasts, records) on a real nccl process group of this one process (a group of one: the sums are the
  inputs, so what holds is that each call runs on the device's tensors and returns them unchanged);
- ``throughput:*``: a larger model (12 layers, width 768) for a few GRPO updates in float32, bfloat16 and
  bfloat16 with LoRA: completion tokens per second from its ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CLI = [sys.executable, "-m", "reflectrl"]
METHODS = ("refgrpo", "rlcr", "refgrpo-seed", "gear-seed", "gear", "exgrpo", "exgrpo-seed")


def _sh(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int, float, str]:
    """Run ``cmd``; (exit code, seconds, last lines of its output). The whole output goes to ``log``."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    log.write_text(f"$ {' '.join(cmd)}\n{out}")
    return rc, time.perf_counter() - t0, "\n".join(out.strip().splitlines()[-4:])


def _records(run: Path) -> list[dict[str, Any]]:
    from reflectrl.runlog import read_metrics

    return read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []


def _untimed(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` without what two equal runs may differ in (timing, throughput, reward-cache hits)."""
    from reflectrl.runlog import is_process_field

    return {k: v for k, v in rec.items() if not is_process_field(k)}


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def _train_check(rc: int, run: Path, updates: int) -> dict[str, Any]:
    recs = _records(run)
    return {"ok": rc == 0 and len(recs) == updates and (run / "checkpoint.safetensors").is_file(),
            "records": len(recs),
            "tokens_per_s_median": _median([r["charts/tokens_per_s"] for r in recs[1:] if "charts/tokens_per_s" in r]),
            "update_s_median": _median([r["time/iteration"] for r in recs[1:] if "time/iteration" in r]),
            "generate_s_median": _median([r["time/generate"] for r in recs[1:] if "time/generate" in r]),
            "reward_mean": [round(r.get("reward/mean", 0.0), 4) for r in recs],
            "grad_norm": [round(r.get("losses/grad_norm", 0.0), 4) for r in recs]}


def cpu_match(model: Path, device: str) -> dict[str, Any]:
    """Log-probs of fixed sequences and the gradient of their mean, on the CPU and on ``device`` (float32). The
    gradients are compared relative to their largest entry; weights after an Adam step are not compared, since
    Adam's first step is about ``lr * sign(g)`` and flips with any rounding of a near-zero gradient."""
    import torch

    from reflectrl.llm.policy import load_policy

    def run(dev: str) -> tuple[Any, dict[str, Any]]:
        pol = load_policy(model, device=dev)
        vocab = pol.model.config.vocab_size
        ids = torch.randint(3, vocab, (8, 48), generator=torch.Generator().manual_seed(1)).to(dev)
        logits = pol.model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        return logp.detach().cpu(), {n: p.grad.detach().cpu() for n, p in pol.model.named_parameters()
                                     if p.grad is not None}

    lp_cpu, g_cpu = run("cpu")
    lp_dev, g_dev = run(device)
    logp_diff = float((lp_cpu - lp_dev).abs().max())
    scale = max(float(g.abs().max()) for g in g_cpu.values())
    g_diff = max(float((g_cpu[k] - g_dev[k]).abs().max()) for k in g_cpu) / scale
    return {"ok": logp_diff < 1e-4 and g_diff < 1e-4 and g_cpu.keys() == g_dev.keys(), "max_abs_logp_diff": logp_diff,
            "max_grad_diff_relative": g_diff, "tolerance": {"logp": 1e-4, "grad_relative": 1e-4}}


def nccl_collectives(device: str) -> dict[str, Any]:
    """Dist's collectives on a one-process nccl group (gloo on the CPU)."""
    import torch
    import torch.distributed as dist

    from reflectrl.llm.distributed import Dist, combine_records

    backend = "nccl" if device.startswith("cuda") else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        d = Dist(rank=0, world=2, local_rank=0, backend=backend)  # world 2 turns the collectives on; the group has 1
        sums = d.sum_floats([1.5, -2.0])
        lin = torch.nn.Linear(4, 3).to(device)
        lin(torch.ones(2, 4, device=device)).sum().backward()
        before = [p.grad.clone() for p in lin.parameters()]
        d.sum_grads_(list(lin.parameters()))
        grads_same = all(torch.equal(a, p.grad) for a, p in zip(before, lin.parameters()))
        w = lin.weight.detach().clone()
        d.broadcast_([lin.weight])
        obj = d.broadcast_object({"update": 3})
        box: list[Any] = [None]  # combine_record's gather, on the group's one process
        dist.all_gather_object(box, ({"reward/mean": 0.25, "rollout/generated_tokens": 10}, 8))
        rec = combine_records(box)
        ok = (sums == [1.5, -2.0] and grads_same and torch.equal(w, lin.weight) and obj == {"update": 3}
              and rec.get("reward/mean") == 0.25)
        return {"ok": bool(ok), "backend": backend, "sum_floats": sums, "grads_unchanged": grads_same, "record": rec}
    finally:
        dist.destroy_process_group()


def _measured(name: str, c: dict[str, Any]) -> str:
    """One check's numbers, in words."""
    if "error" in c:
        return c["error"]
    if name == "warmup":
        return f"{c.get('steps')} steps, train accuracy {c.get('train_accuracy'):.3f}"
    if name == "cpu_match":
        if "max_grad_diff_relative" in c:
            return (f"max abs log-prob diff {c['max_abs_logp_diff']:.2e}, max gradient diff {c['max_grad_diff_relative']:.2e}"
                    " of the largest gradient entry")
        return (f"max abs log-prob diff {c['max_abs_logp_diff']:.2e}, max abs weight diff after one AdamW step "
                f"{c['max_abs_weight_diff_after_step']:.2e} (tolerance {c['tolerance']['weights']:.0e})")
    if name == "repeat":
        return "records equal to the first run's, timing aside" if c.get("bitwise_repeatable") else \
            f"records equal, timing aside: {c.get('records_equal_untimed')}"
    if name == "eval":
        return f"held-out accuracy {c.get('accuracy')} (n={c.get('n')})"
    if name == "torchrun_too_many":
        return f"exit code {c.get('exit_code')}, the one error line {'found' if c.get('error_line_found') else 'missing'}"
    if name == "nccl_collectives":
        return f"backend {c.get('backend')}, sums {c.get('sum_floats')}, gradients unchanged: {c.get('grads_unchanged')}"
    if "records" in c:
        tps = c.get("tokens_per_s_median")
        grads = c.get("grad_norm") or []
        gen, upd = c.get("generate_s_median"), c.get("update_s_median")
        return (f"{c['records']} updates" + (f", {tps:.0f} completion tokens/s (median)" if tps else "")
                + (f", generation {gen / upd:.0%} of an update" if gen and upd else "")
                + (f", grad norm {min(grads):.3f}-{max(grads):.3f}" if grads else ""))
    return ""


def render(files: list[str]) -> None:
    """Markdown: one row per check of each results file (benchmarks/results/NAME)."""
    for i, f in enumerate(files):
        path = Path(f) if Path(f).is_file() else Path(__file__).parent / "results" / f
        d = json.loads(path.read_text())
        print(f"`{path.name}`: {d.get('gpu_name') or 'no GPU'} ({d['gpus']} visible), {d['cpus']} CPUs, torch {d['torch']}, "
              f"transformers {d['transformers']}, device `{d['device']}`.\n")
        print("| check | held | measured | seconds |\n|---|---|---|---|")
        for name, c in d["checks"].items():
            print(f"| {name} | {'yes' if c['ok'] else 'no'} | {_measured(name, c)} | {c.get('seconds')} |")
        if i < len(files) - 1:
            print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench/gpu_check", help="work folder (replaced)")
    ap.add_argument("--json-out", default=None, help="write the results here as JSON")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--updates", type=int, default=6, help="GRPO updates of the train check")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per command")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--render", nargs="+", default=None, metavar="FILE",
                    help="print the results files (in benchmarks/results/) as markdown tables and exit")
    ap.add_argument("--only", nargs="+", default=None, metavar="CHECK",
                    help="run only these checks (and the warm-up they start from), e.g. cpu_match torchrun")
    args = ap.parse_args(argv)
    if args.render:
        render(args.render)
        return 0

    import torch
    import transformers

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    dev, T = args.device, args.timeout
    res: dict[str, Any] = {"device": dev, "torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda_available": torch.cuda.is_available(),
                           "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                           "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                           "cpus": os.cpu_count(), "checks": {}}
    checks: dict[str, Any] = res["checks"]

    def wanted(name: str) -> bool:
        return not args.only or name == "warmup" or name in args.only or name.split(":")[0] in args.only

    def record(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if not wanted(name):
            return
        t0 = time.perf_counter()
        try:
            r = fn()
        except Exception as exc:  # a check that raises is a failed check, with its reason
            r = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        r.setdefault("seconds", round(time.perf_counter() - t0, 2))
        checks[name] = r
        print(f"{name}: {'ok' if r['ok'] else 'FAILED'} ({r['seconds']} s)", flush=True)

    tiny, warm = out / "tiny", out / "warm"

    def warmup() -> dict[str, Any]:
        rc, s, tail = _sh([*CLI, "llm", "init-tiny", str(tiny), "--seed", "1"], out / "init.log", T)
        if rc:
            return {"ok": False, "tail": tail}
        rc, s, tail = _sh([*CLI, "llm", "warmup", "--model", str(tiny), "--task", "arith", "--out", str(warm),
                           "--steps", "1500", "--batch-size", "64", "--eval-every", "100", "--eval-problems", "128",
                           "--stop-at-accuracy", "0.2", "--self-report", "all", "--teacher-share", "0.25",
                           "--device", dev, "--no-progress"], out / "warmup.log", T)
        info = json.loads((warm / "warmup.json").read_text()) if (warm / "warmup.json").is_file() else {}
        return {"ok": rc == 0 and bool(info), "tail": tail if rc else "",
                **{k: info.get(k) for k in ("steps", "train_accuracy", "wall_s")}}

    record("warmup", warmup)
    record("cpu_match", lambda: cpu_match(warm, dev))

    def train(updates: int, model: Path = warm, prompts: int = 32, gen_batch: int = 256) -> list[str]:
        return ["llm", "train", "--task", "arith", "--model", str(model), "--device", dev, "--updates", str(updates),
                "--prompts-per-update", str(prompts), "--gen-batch", str(gen_batch), "--no-progress"]

    def run_train(name: str, extra: list[str], updates: int | None = None, launcher: list[str] | None = None,
                  **kw: Any) -> dict[str, Any]:
        run, updates = out / name.replace(":", "_"), updates or args.updates
        algo = [] if "--algo" in extra else ["--algo", "grpo"]
        rc, s, tail = _sh([*(launcher or CLI), *train(updates, **kw), *algo, "--run-dir", str(run), *extra],
                          out / f"{run.name}.log", T)
        r = _train_check(rc, run, updates)
        return {**r, "tail": "" if r["ok"] else tail, "seconds": round(s, 2)}

    record("train", lambda: run_train("train", []))

    def repeat() -> dict[str, Any]:
        r = run_train("repeat", [])
        a, b = _records(out / "train"), _records(out / "repeat")
        equal = [_untimed(x) == _untimed(y) for x, y in zip(a, b)]
        return {"ok": r["ok"], "records_equal_untimed": equal, "bitwise_repeatable": bool(equal) and all(equal)}

    record("repeat", repeat)

    def resume() -> dict[str, Any]:
        run = out / "train"
        rc, s, tail = _sh([*CLI, "llm", "train", "--resume", str(run), "--updates", str(args.updates + 2),
                           "--no-progress"], out / "resume.log", T)
        return {**_train_check(rc, run, args.updates + 2), "tail": tail if rc else ""}

    record("resume", resume)

    def evaluate() -> dict[str, Any]:
        rc, s, tail = _sh([*CLI, "llm", "eval", str(out / "train"), "--device", dev, "--limit", "200", "--json",
                           "--self-report", "both"], out / "eval.log", T)
        try:
            r = json.loads(tail.splitlines()[-1])
        except (ValueError, IndexError):
            return {"ok": False, "tail": tail}
        return {"ok": rc == 0, **{k: r.get(k) for k in ("accuracy", "n", "ece", "auroc")}}

    record("eval", evaluate)

    with ThreadPoolExecutor(4) as pool:
        futs = {m: pool.submit(run_train, f"method:{m}", ["--algo", m], 3) for m in METHODS if wanted(f"method:{m}")}
        for m, f in futs.items():
            record(f"method:{m}", f.result)

    def rag() -> dict[str, Any]:
        run = out / "rag"
        rc, s, tail = _sh([*CLI, "llm", "train", "--algo", "rlcr", "--task", "rag", "--model", str(tiny),
                           "--task-options", "report=steps", "--self-report", "inline", "--rlcr-confidence", "steps",
                           "--device", dev, "--updates", "2", "--prompts-per-update", "8", "--run-dir", str(run),
                           "--no-progress"], out / "rag.log", T)
        return {**_train_check(rc, run, 2), "tail": tail if rc else ""}

    record("rag", rag)

    n = max(res["gpus"], 1) if dev.startswith("cuda") else 2
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    record("torchrun", lambda: {**run_train("torchrun", [], launcher=[*torchrun, "--nproc-per-node", str(n), "-m",
                                                                      "reflectrl"]), "processes": n})

    def too_many() -> dict[str, Any]:
        run = out / "torchrun_too_many"
        rc, s, tail = _sh([*torchrun, "--nproc-per-node", str(n + 1), "-m", "reflectrl", *train(2), "--run-dir", str(run)],
                          out / "torchrun_too_many.log", T)
        said = "CUDA devices are visible" in (out / "torchrun_too_many.log").read_text()
        return {"ok": rc != 0 and said, "exit_code": rc, "error_line_found": said}

    if dev.startswith("cuda"):
        record("torchrun_too_many", too_many)
    record("nccl_collectives", lambda: nccl_collectives(dev))

    if not args.skip_throughput and wanted("throughput"):
        big = out / "big"
        _sh([*CLI, "llm", "init-tiny", str(big), "--layers", "12", "--width", "768", "--heads", "12", "--seed", "1"],
            out / "init_big.log", T)
        for label, extra in (("float32", []), ("bfloat16", ["--dtype", "bfloat16"]),
                             ("bfloat16_lora16", ["--dtype", "bfloat16", "--lora-r", "16"])):
            record(f"throughput:{label}", lambda extra=extra, label=label: {
                **run_train(f"big_{label}", extra, 4, model=big, prompts=64, gen_batch=512),
                "model": "llama, 12 layers, width 768, 12 heads"})

    res["all_ok"] = all(c["ok"] for c in checks.values())
    print(json.dumps({k: ("ok" if v["ok"] else "FAILED") for k, v in checks.items()}, indent=1))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["all_ok"] else 1


if __name__ == "__main__":
    if rc := main():  # no SystemExit on success: render_all.py runs this file in its own process
        sys.exit(rc)
