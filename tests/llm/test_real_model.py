"""The real pretrained model end to end (slow; ``make test-slow``): SmolLM2-135M-Instruct through ``get-model``,
chat-framed rollouts, every ``--algo`` for an update with LoRA and with full fine-tuning, and a resumed run equal
to an uninterrupted one."""

import json

import pytest
import torch
from safetensors.torch import load_file

from reflectrl.algos import config_for_algo, resume
from reflectrl.llm.grpo import GRPO
from reflectrl.runlog import behaviour, read_metrics
from reflectrl.trainer import CHECKPOINT

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
ALGOS = ("grpo", "drgrpo", "dapo", "refgrpo", "rlcr", "refgrpo-seed", "gear-seed", "gear", "exgrpo", "exgrpo-seed")


@pytest.fixture(scope="module")
def model_dir():
    from reflectrl.llm.models import get_model

    return get_model(MODEL)  # converted once into the cache, checked by loading it back


def small(tmp_path, name, algo="grpo", **kw):
    base = dict(task="arith", model=MODEL, run_dir=str(tmp_path / name), updates=2, prompts_per_update=2,
                max_new_tokens=8, seed=3, progress=False, tensorboard=False, threads=1, reward_workers=0,
                sample_interval=1, lora_r=4)
    base.update(kw)
    return config_for_algo(algo, **base)


def test_get_model_writes_a_checked_plain_folder(model_dir):
    info = json.loads((model_dir / "reflectrl_model.json").read_text())
    assert info["checked"]["logits_max_abs_diff"] == 0.0 and info["checked"]["chat_template"]
    assert "quantization_config" not in json.loads((model_dir / "config.json").read_text())
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "chat_template.jinja").is_file()


def test_the_model_defaults_and_chat_prompts(model_dir, tmp_path):
    cfg = small(tmp_path, "d")
    assert cfg.learning_rate == 1e-4 and cfg.temperature == 0.6
    trainer = GRPO(cfg)
    assert trainer.policy.chat is not None and trainer.cfg.max_new_tokens == 8
    trainer.learn()
    sample = json.loads((tmp_path / "d" / "samples.jsonl").read_text().splitlines()[0])
    assert "Reply with only the number" in json.dumps(sample)


def test_resume_equals_uninterrupted(model_dir, tmp_path):
    GRPO(small(tmp_path, "full", updates=3, minibatches=2)).learn()
    GRPO(small(tmp_path, "cut", updates=2, minibatches=2)).learn()
    resume(tmp_path / "cut", 3).learn()
    a = behaviour(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    b = behaviour(read_metrics(tmp_path / "cut" / "metrics.jsonl"))
    assert len(a) == 3 and a == b
    ta, tb = load_file(str(tmp_path / "full" / CHECKPOINT)), load_file(str(tmp_path / "cut" / CHECKPOINT))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_a_lora_run_exports_a_small_adapter_that_loads_as_the_trained_policy(model_dir, tmp_path):
    """A LoRA run's model/ is its adapter (not a 517 MB merged model), naming the converted folder and the model's
    name; loaded back (and merged by `llm export --merge`) it gives the trained policy's log-probs."""
    from reflectrl.llm.export import export_run
    from reflectrl.llm.policy import load_policy

    trainer = GRPO(small(tmp_path, "lora", learning_rate=1e-3))
    trainer.learn()
    model = tmp_path / "lora" / "model"
    assert sum(f.stat().st_size for f in model.iterdir()) < 20e6 and not (model / "model.safetensors").exists()
    info = json.loads((model / "reflectrl_adapter.json").read_text())
    assert info == {"base_model": str(model_dir.resolve()), "base_name": MODEL}
    batch = trainer.last_batch
    trainer.policy.eval()
    merged = export_run(tmp_path / "lora", merge=True)
    assert merged["format"] == "merged" and merged["bytes"] > 400e6
    with torch.no_grad():
        want = trainer.policy.forward_batch(batch).logp
        for folder in (model, tmp_path / "lora" / "merged"):
            got = load_policy(folder).forward_batch(batch).logp
            assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


@pytest.mark.parametrize("lora_r", [4, 0])
@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_trains_an_update(model_dir, tmp_path, algo, lora_r):
    from reflectrl.algos import get_algo

    extra = {} if algo == "gear-seed" else {"group_size": 4}
    cfg = small(tmp_path, algo, algo, updates=1, lora_r=lora_r, export_model=False, **extra)
    summary = get_algo("llm", algo).make(cfg).learn()
    assert summary["updates"] == 1 and (tmp_path / algo / CHECKPOINT).is_file()
    rec = read_metrics(tmp_path / algo / "metrics.jsonl")[-1]
    assert torch.isfinite(torch.tensor(rec["losses/grad_norm"]))
    if cfg.self_report in ("reflect", "confidence"):  # the question was asked in the chat form and answered
        assert "calibration/missing_rate" in rec or any(k.startswith("calibration/") for k in rec)


def test_the_documented_commands(model_dir, capsys):
    """README's commands on the real model, shrunk: get-model prints the folder; eval asks for both self-reports
    through the chat template and parses them."""
    from reflectrl.cli import main

    assert main(["llm", "get-model", MODEL]) == 0
    assert capsys.readouterr().out.strip() == str(model_dir)
    assert main(["llm", "eval", MODEL, "--task", "arith", "--split", "heldout", "--limit", "8",
                 "--self-report", "both", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 8 and res["reflection_missing_rate"] <= 0.25 and res["confidence_missing_rate"] <= 0.25


def test_the_sampler_log_probs_are_the_trainers_on_the_real_model(model_dir, tmp_path):
    """--old-logp engine on the real model with LoRA, asked a confidence after each answer (two turns, chat framed):
    the sampler's log-probs of its tokens equal the trainer's forward within float32 rounding."""
    from reflectrl.llm.batch import ENGINE_LOGP

    trainer = GRPO(small(tmp_path, "lp", updates=1, group_size=2, old_logp="engine", self_report="confidence",
                         export_model=False))
    problems, group, offset, gen = trainer.draw_problems()
    batch, _ = trainer.rollout.run(problems, group, gen, index_offset=offset)
    with torch.no_grad():
        ref = trainer.policy.forward_batch(batch, temperature=trainer.cfg.temperature).logp
    m = batch.completion_mask
    assert int(batch.turn_ids.max()) >= 1 and int(m.sum()) > 8
    torch.testing.assert_close(batch.extras[ENGINE_LOGP][m], ref[:, :batch.steps][m], rtol=0, atol=2e-4)
    trainer.rollout.close()


def test_the_shared_prompt_layout_on_the_real_model(model_dir, tmp_path):
    """--attention shared-prompt on the real model with LoRA and its chat prompts (a group's rows share one): the
    log-probs and the adapter's gradient equal the padded layout's within float32 rounding (of the gradient's scale)."""
    trainer = GRPO(small(tmp_path, "sp", updates=1, group_size=3, export_model=False))
    problems, group, offset, gen = trainer.draw_problems()
    batch, _ = trainer.rollout.run(problems, group, gen, index_offset=offset)
    pol = trainer.policy
    assert batch.rows > len({tuple(r.tolist()) for r in batch.prompt_ids}) and int(batch.completion_mask.sum()) > 4
    outs = []
    for layout in ("padded", "shared-prompt"):
        pol.attention = layout
        pol.zero_grad(set_to_none=True)
        logp = pol.forward_batch(batch).logp
        logp.sum().backward()
        outs.append((logp.detach(), torch.cat([p.grad.flatten() for p in pol.trainable_parameters()])))
    pol.attention = "padded"
    (lp_a, g_a), (lp_b, g_b) = outs
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=2e-4)
    assert g_a.abs().sum() > 0
    # float32 sums over 30 layers, in another order (a shared prompt's gradient is summed over its rows at once)
    assert float((g_b - g_a).norm() / g_a.norm()) < 1e-3
    torch.testing.assert_close(g_b, g_a, rtol=0, atol=1e-4 * float(g_a.abs().max()))
    trainer.rollout.close()


def test_the_lean_decoding_step_on_the_real_model(model_dir, tmp_path):
    """The real model (grouped-query attention, tied embeddings) with LoRA passes the lean step's check, and a chat
    rollout draws the same tokens and log-probs with the lean step as with the model's forward at every step."""
    trainer = GRPO(small(tmp_path, "lean", updates=1, group_size=2, old_logp="engine", export_model=False))
    pol = trainer.policy
    with torch.no_grad():  # a nonzero adapter, so that an adapter left out of the step would change the tokens
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(3))
    problems, group, offset, gen = trainer.draw_problems()
    state = gen.get_state()
    runs = []
    for lean in (True, False):
        pol._lean = None if lean else (pol.model, None)
        gen.set_state(state)
        batch, _ = trainer.rollout.run(problems, group, gen, index_offset=offset)
        runs.append(batch)
        if lean:
            assert pol._lean is not None and pol._lean[1] is not None  # the check passed: the lean step ran
    a, b = runs
    assert torch.equal(a.response_ids, b.response_ids) and int(a.completion_mask.sum()) > 4
    from reflectrl.llm.batch import ENGINE_LOGP

    assert torch.equal(a.extras[ENGINE_LOGP], b.extras[ENGINE_LOGP])
    trainer.rollout.close()


def test_a_named_model_run_stopped_by_sigint_resumes_from_another_folder(model_dir, tmp_path):
    """``--model smollm2-135m-instruct`` from the command line, stopped with SIGINT after 2 updates, resumes from
    another working folder to the run that never stopped (its config records the converted folder and the name)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    flags = ["llm", "train", "--task", "arith", "--model", MODEL, "--lora-r", "4", "--prompts-per-update", "2",
             "--group-size", "2", "--max-new-tokens", "6", "--updates", "6", "--seed", "3", "--threads", "1",
             "--no-progress", "--no-tensorboard", "--no-export-model", "--sample-interval", "1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl.cli", *flags, "--run-dir", "cut"], cwd=tmp_path / "a",
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics = tmp_path / "a" / "cut" / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "--resume" in err.strip().splitlines()[-1], err
    cfg = json.loads((tmp_path / "a" / "cut" / "config.json").read_text())
    assert cfg["model"] == str(model_dir) and cfg["model_name"] == MODEL
    resumed = subprocess.run([sys.executable, "-m", "reflectrl.cli", "llm", "train", "--resume", "../a/cut",
                              "--no-progress"], cwd=tmp_path / "b", env=env, text=True, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run([sys.executable, "-m", "reflectrl.cli", *flags, "--run-dir", "whole"], cwd=tmp_path / "b",
                           env=env, text=True, capture_output=True)
    assert whole.returncode == 0, whole.stderr
    a = behaviour(read_metrics(tmp_path / "a" / "cut" / "metrics.jsonl"))
    b = behaviour(read_metrics(tmp_path / "b" / "whole" / "metrics.jsonl"))
    assert len(a) == 6 and a == b
    assert (tmp_path / "a" / "cut" / "samples.jsonl").read_text() == (tmp_path / "b" / "whole" / "samples.jsonl").read_text()


def test_the_demo_shows_the_real_model_before_and_after(model_dir, tmp_path, capsys):
    """``reflectrl demo``'s LLM half, shrunk to one update and two problems: both evaluations with the inline
    confidence, the recipe's run, and the summary side by side."""
    from reflectrl.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--skip-control", "--llm-updates", "1", "--llm-problems", "2", "--threads", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "before:" in text and "after:" in text and "points [95% interval" in text
    s = json.loads((out / "llm" / "summary.json").read_text())
    assert s["recipe"] == "real-arith" and s["before"]["n"] == s["after"]["n"] == 2 and s["updates"] == 1
    assert s["before"]["confidence_missing_rate"] <= 0.5 and s["gain"] == s["after"]["accuracy"] - s["before"]["accuracy"]
    cfg = json.loads((out / "llm" / "grpo" / "config.json").read_text())
    assert cfg["task_options"] == ["ops=+"] and cfg["lora_r"] == 16
