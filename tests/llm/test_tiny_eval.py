"""init-tiny round trip, warm-up, evaluation statistics and the eval command."""

import json
import math

import pytest
import torch

from reflectrl.llm.evaluate import evaluate_policy, pass_at_k, wilson_interval
from reflectrl.tasks.base import get_task


def test_init_tiny_round_trip(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    text = "def f(x):\n\treturn x + 7  # ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == len(tok)
    again = AutoModelForCausalLM.from_pretrained(tiny_dir)
    x = torch.tensor([ids])
    assert torch.equal(model(x).logits, again(x).logits)


def test_wilson_and_pass_at_k():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    for n, c, k in [(5, 0, 1), (5, 2, 1), (5, 2, 3), (10, 3, 5), (4, 4, 2)]:
        brute = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_evaluate_greedy_and_sampled(tiny_policy):
    task = get_task("toy-add")
    g = evaluate_policy(tiny_policy, task, "heldout", max_new_tokens=3)
    assert g["mode"] == "greedy" and g["n"] == 16 and 0 <= g["ci"][0] <= g["accuracy"] <= g["ci"][1] <= 1
    s = evaluate_policy(tiny_policy, task, "heldout", samples=2, n=3, max_new_tokens=3, limit=5)
    assert s["n"] == 5 and s["samples_per_problem"] == 3 and "pass@2" in s and s["pass@2"] >= s["accuracy"] - 1e-9


def test_per_problem_correctness_is_in_the_split_s_order(tiny_policy):
    from .toytasks import AddTask

    class EvenRight(AddTask):  # every completion is right on problems whose first operand is even
        def score(self, problem, completion):
            return float(int(problem.prompt.split("+")[0]) % 2 == 0)

    task = EvenRight()
    want = [float(int(p.prompt.split("+")[0]) % 2 == 0) for p in task.problems("heldout")]
    assert 0 < sum(want) < len(want)
    g = evaluate_policy(tiny_policy, task, "heldout", max_new_tokens=3, per_problem=True, gen_batch=4)
    assert g["per_problem"] == want and g["accuracy"] == sum(want) / len(want)
    s = evaluate_policy(tiny_policy, task, "heldout", samples=2, n=3, max_new_tokens=3, per_problem=True)
    assert s["per_problem"] == want
    assert "per_problem" not in evaluate_policy(tiny_policy, task, "heldout", max_new_tokens=3, limit=2)
    t = evaluate_policy(tiny_policy, task, "heldout", max_new_tokens=3, transcripts=True, gen_batch=4)
    assert [e["problem"] for e in t["episodes"]] == [p.id for p in task.problems("heldout")]
    assert [float(e["correct"]) for e in t["episodes"]] == want
    assert all(e["transcript"][0][0] == "prompt" and e["transcript"][-1][0] == "policy" for e in t["episodes"])
    assert "episodes" not in g


def test_warmup_then_eval_cli(tiny_dir, tmp_path, capsys):
    from reflectrl.cli import main

    out = tmp_path / "warm"
    assert main(["llm", "warmup", "--model", str(tiny_dir), "--task", "toy-add", "--out", str(out), "--steps", "5",
                 "--batch-size", "8", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 5 and (out / "warmup.json").is_file()
    assert main(["llm", "eval", str(out), "--task", "toy-add", "--json", "--max-new-tokens", "3"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"accuracy", "n", "ci"} <= set(res) and res["n"] == 16
    assert main(["llm", "eval", str(out), "--task", "toy-add", "--samples", "2", "--max-new-tokens", "3"]) == 0
    assert "pass@2" in capsys.readouterr().out


def test_eval_of_run_dir_uses_its_checkpoint(tiny_dir, tmp_path, capsys):
    from reflectrl.cli import main

    run = tmp_path / "r"
    assert main(["llm", "train", "--algo", "drgrpo", "--task", "toy-add", "--model", str(tiny_dir), "--run-dir",
                 str(run), "--updates", "1", "--prompts-per-update", "2", "--group-size", "2", "--max-new-tokens", "2",
                 "--no-progress", "--no-tensorboard"]) == 0
    capsys.readouterr()
    assert main(["llm", "eval", str(run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["task"] == "toy-add" and res["n"] == 16
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["adv_estimator"] == "drgrpo" and cfg["loss_agg_mode"] == "seq-mean-token-sum-norm"
    # more updates on the finished run
    assert main(["llm", "train", "--resume", str(run), "--updates", "2", "--no-progress"]) == 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_lora_policy_reference_heads_and_export(tiny_dir, tmp_path):
    """LoRA trains only the adapter (and heads); the reference is the adapter-free base; the export is the adapter
    (or, merged, a plain model directory), and either loads back as the trained policy with the heads."""
    from reflectrl.llm.batch import RowResult, Segment, build_batch
    from reflectrl.llm.policy import load_policy

    pol = load_policy(tiny_dir, lora_r=4, ref=True)
    pol.add_head("value")
    names = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n or n.startswith("heads.") for n in names)
    batch = build_batch([RowResult([5, 6], [Segment([7, 8, 9], "policy", 0)], None, 0.0, False, False, [])],
                        [0], [], 0)
    out = pol.forward_batch(batch, with_hidden=True)
    assert torch.allclose(out.logp, pol.ref_logprobs(batch))  # LoRA's B starts at zero
    assert pol.head("value", out.hidden).shape == (1, 3)
    (-out.logp.sum() + pol.head("value", out.hidden).pow(2).sum()).backward()
    opt = torch.optim.SGD(pol.trainable_parameters(), lr=1.0)
    opt.step()
    with torch.no_grad():
        moved = pol.forward_batch(batch).logp
    assert not torch.allclose(moved, pol.ref_logprobs(batch))
    for merge in (False, True):
        out = pol.save_pretrained(tmp_path / f"export-{merge}", merge=merge)
        assert (out / "config.json").is_file() == merge and (out / "adapter_config.json").is_file() != merge
        back = load_policy(out)
        assert "value" in back.heads and torch.allclose(back.forward_batch(batch).logp, moved, atol=1e-5)


def test_an_evaluation_s_confidence_intervals_are_over_problems():
    """Two samples of each of 30 problems: the AUROC interval is DeLong's with a problem's samples as one group, the
    ECE interval a bootstrap over problems, the selective accuracies those of the reports (a missing confidence
    abstains, so full coverage is out of reach); one sample per problem makes every row its own problem."""
    import numpy as np

    from reflectrl.eval.calibration import selective_accuracies
    from reflectrl.eval.uncertainty import auroc_interval, ece_interval
    from reflectrl.llm.evaluate import _report_metrics

    rng = np.random.default_rng(0)
    q = np.round(rng.uniform(size=(30, 2)), 2)
    correct = rng.uniform(size=(30, 2)) < q
    finals = [{"confidence": None if i == 5 else float(v)} for i, v in enumerate(q.ravel())]  # problem-major rows
    stated, y, groups = [f["confidence"] for f in finals], correct.ravel(), np.repeat(np.arange(30), 2)
    m = _report_metrics("confidence", correct, finals, 0.9)
    assert m["auroc_ci"] == pytest.approx(list(auroc_interval(stated, y, groups, level=0.9).ci))
    assert m["auroc_ci"] != pytest.approx(list(auroc_interval(stated, y, level=0.9).ci))
    assert m["ece_ci"] == pytest.approx(list(ece_interval(stated, y, groups, level=0.9).ci))
    assert m["ece_ci"] != pytest.approx(list(ece_interval(stated, y, level=0.9).ci))
    want = selective_accuracies(stated, y)
    assert [m[f"selective_accuracy@{c}"] for c in (0.5, 0.8)] == pytest.approx(
        [want["selective_accuracy@0.5"], want["selective_accuracy@0.8"]])
    assert m["selective_accuracy@1.0"] is None and "auroc_no_ci" not in m
    one = _report_metrics("confidence", correct[:, :1], finals[::2])
    assert one["auroc_ci"] == pytest.approx(list(auroc_interval(stated[::2], y[::2]).ci))
    refl = _report_metrics("reflect", correct, [{"reflection": 1.0}] * 60)
    assert not any(k.startswith("selective_accuracy@") or k.endswith("_ci") for k in refl)


def test_eval_prints_the_intervals_and_selective_accuracy(tiny_dir, capsys):
    from reflectrl.cli import main
    from reflectrl.cli.eval_report import report_lines

    assert main(["llm", "eval", str(tiny_dir), "--task", "toy-add", "--limit", "3", "--self-report", "confidence",
                 "--max-new-tokens", "3", "--json", "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # a random model states no confidence
    assert res["auroc_ci"] is None and res["auroc_no_ci"] == "interval needs >= 10 rows" and res["ece_ci"] is None
    assert [res[f"selective_accuracy@{c}"] for c in (0.5, 0.8, 1.0)] == [None, None, None]
    lines = report_lines({"confidence_missing_rate": 0.1, "ci_level": 0.9, "auroc_ci": [0.61, 0.8],
                          "ece_ci": None, "ece_no_ci": "interval needs >= 10 rows", "selective_accuracy@0.5": 0.9,
                          "selective_accuracy@0.8": 0.8125, "selective_accuracy@1.0": None})
    assert lines[1:] == ["confidence 90% intervals: AUROC (DeLong) [0.610, 0.800]; ECE (bootstrap over problems) none, "
                         "interval needs >= 10 rows",
                         "selective accuracy (the most confident answers kept; a missing confidence abstains): 0.900 at "
                         "50% coverage, 0.812 at 80%, n/a at 100%"]
