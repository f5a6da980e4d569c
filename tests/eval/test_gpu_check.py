"""benchmarks/gpu_check.py: its checks that run on a CPU (the comparison of two devices, Dist's collectives on a
process group of one, a run's records) and its table."""

import json
import socket

from .helpers import benchmark_script


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpu_match_on_the_cpu_is_exact(tmp_path):
    from reflectrl.llm.tiny import init_tiny

    mod = benchmark_script("gpu_check")
    model = init_tiny(tmp_path / "m", layers=1, width=32, heads=2, max_positions=64, seed=0)
    r = mod.cpu_match(model, "cpu")
    assert r["ok"] and r["max_abs_logp_diff"] == 0.0 and r["max_grad_diff_relative"] == 0.0


def test_collectives_on_a_group_of_one(monkeypatch):
    mod = benchmark_script("gpu_check")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    r = mod.nccl_collectives("cpu")
    assert r["ok"] and r["backend"] == "gloo" and r["sum_floats"] == [1.5, -2.0]
    assert r["record"] == {"reward/mean": 0.25, "rollout/generated_tokens": 10}


def test_train_check_counts_records_and_needs_a_checkpoint(tmp_path):
    mod = benchmark_script("gpu_check")
    recs = [{"update": i, "charts/tokens_per_s": 100.0 * i, "time/iteration": 0.5, "time/generate": 0.4, "reward/mean": 0.25,
             "losses/grad_norm": 0.1 * i} for i in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert not mod._train_check(0, tmp_path, 3)["ok"]  # no checkpoint
    (tmp_path / "checkpoint.safetensors").write_bytes(b"x")
    r = mod._train_check(0, tmp_path, 3)
    assert r["ok"] and r["records"] == 3 and r["tokens_per_s_median"] == 300.0  # the first update left out
    assert r["grad_norm"] == [0.1, 0.2, 0.3] and r["generate_s_median"] == 0.4
    assert "generation 80% of an update" in mod._measured("train", r)
    assert not mod._train_check(0, tmp_path, 4)["ok"] and not mod._train_check(1, tmp_path, 3)["ok"]
    assert mod._untimed(recs[0]) == {"update": 1, "reward/mean": 0.25, "losses/grad_norm": 0.1}


def test_render(tmp_path, capsys):
    mod = benchmark_script("gpu_check")
    res = {"device": "cuda", "torch": "2.0", "transformers": "5.0", "gpus": 1, "gpu_name": "GPU X", "cpus": 4,
           "checks": {"train": {"ok": True, "records": 2, "tokens_per_s_median": 1234.4, "grad_norm": [0.1, 0.3],
                                "seconds": 3.0},
                      "eval": {"ok": False, "error": "ConfigError: no model", "seconds": 0.1}}}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(res))
    assert mod.main(["--render", str(f)]) == 0
    out = capsys.readouterr().out
    assert "`r.json`: GPU X (1 visible), 4 CPUs" in out
    assert "| train | yes | 2 updates, 1234 completion tokens/s (median), grad norm 0.100-0.300 | 3.0 |" in out
    assert "| eval | no | ConfigError: no model | 0.1 |" in out
