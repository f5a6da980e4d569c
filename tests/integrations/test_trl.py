"""reflectrl inside TRL's GRPOTrainer: the example runs a few steps on the CPU, and the calibration it logs equals
reflectrl.eval.calibration recomputed from the same completions; the completions it dumps are strict JSON that
``reflectrl calibration`` reads back to the callback's numbers; the reward functions against hand-worked values."""

import json
import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from reflectrl.cli import main as cli_main  # noqa: E402
from reflectrl.eval.calibration import self_report_metrics  # noqa: E402
from reflectrl.integrations import trl as R  # noqa: E402
from reflectrl.tasks.base import get_task, parse_confidence  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def confident_tiny(tmp_path_factory):
    """A tiny model warmed up on arith to end its answers with <confidence>q</confidence> (raw prompts)."""
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup

    root = tmp_path_factory.mktemp("trl")
    tiny = init_tiny(root / "tiny", layers=1, width=32, heads=2, max_positions=256, seed=0)
    warmup(WarmupConfig(model=str(tiny), task="arith", out=str(root / "warm"), steps=300, batch_size=32,
                        learning_rate=3e-3, self_report="inline", progress=False))
    return root / "warm"


def test_the_example_logs_the_calibration_of_its_completions(confident_tiny, tmp_path, capsys):
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", str(confident_tiny), "--steps", "3", "--out", str(tmp_path)])
    assert [h["step"] for h in history] == [1, 2, 3]
    kept = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    task = get_task("arith")
    problems = {p.id: p for s in ("train", "heldout") for p in task.problems(s)}
    stated = 0
    for h in history:  # recompute each step's metrics from its completions' texts, independently of the rewards
        rows = [r for r in kept if r["step"] == h["step"]]
        assert len(rows) == h["calibration/completions"] == 8
        y = [float(task.score(problems[r["problem_id"]], r["completion"]) >= 1.0) for r in rows]
        q = [parse_confidence(r["completion"]) for r in rows]
        stated += sum(v is not None for v in q)
        want = self_report_metrics(np.array(y), None, np.array([math.nan if v is None else v for v in q]))
        assert h["calibration/accuracy"] == pytest.approx(want["accuracy"])
        for key in ("ece", "brier", "auroc", "mean_confidence"):
            if math.isfinite(want[key]):
                assert h[f"calibration/{key}"] == pytest.approx(want[key]), key
            else:
                assert f"calibration/{key}" not in h
    assert stated > 0  # the warmed-up model states confidences: the check is not of empty reports
    logged = [json.loads(line) for line in (tmp_path / "calibration.jsonl").read_text().splitlines()]
    assert logged == history
    pooled = R.calibration_of(_strict_lines(tmp_path / "completions.jsonl"))  # every step's completions at once
    assert cli_main(["calibration", str(tmp_path / "completions.jsonl"), "--json", "--reps", "20"]) == 0
    cal = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the example's and TRL's own lines
    assert cal["rows"] == pooled["calibration/completions"] == 24
    for key in ("accuracy", "ece", "auroc", "confidence_missing_rate"):
        got = cal[key] if key == "accuracy" else cal[key]["value"]
        assert got == pytest.approx(pooled[f"calibration/{key}"]) if f"calibration/{key}" in pooled else got is None


def _strict_lines(path: Path) -> list[dict]:
    """The rows of a JSONL file, failing on a bare NaN or Infinity (not JSON)."""
    def refuse(word):
        raise AssertionError(f"{path} holds {word}: not strict JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_reflectrl_calibration_reads_the_dump_back_to_the_callbacks_numbers(tmp_path, capsys):
    """Completions scored by a reward with a log, kept by the callback and dumped with write_records (as the example
    does): strict JSON with null for a report not stated, and ``reflectrl calibration`` gives the callback's metrics."""
    task = get_task("arith")
    problems = [p for p in task.problems("train") if p.meta["ops"] == ["+"]][:12]
    completions, ids = [], []
    for i, p in enumerate(problems):
        answer = str(p.meta["value"] + (i % 3 == 0))  # every third one wrong
        report = ("" if i % 4 == 1 else f"<confidence>{(0.9 if i % 3 else 0.3) - 0.01 * i:.2f}</confidence>") + \
            ("<reflect>solved</reflect>" if i % 5 == 0 else "<reflect>unsolved</reflect>" if i % 5 == 1 else "")
        completions += [answer + report, answer + "0" + report]  # and a wrong copy with the same reports: 24 in all
        ids += [p.id, p.id]
    log = R.RewardLog()
    R.rlcr_reward("arith", log=log)(completions=completions, problem_id=ids)
    callback = R.CalibrationCallback(log, keep=True)
    callback.on_log(None, SimpleNamespace(global_step=1, log_history=[{}]), None, logs={})
    records = callback.kept
    assert any(math.isnan(r["confidence"]) for r in records) and any(math.isnan(r["reflection"]) for r in records)
    dump = R.write_records(tmp_path / "completions.jsonl", records)
    rows = _strict_lines(dump)
    assert [r["confidence"] is None for r in rows] == [math.isnan(r["confidence"]) for r in records]
    assert cli_main(["calibration", str(dump), "--json", "--reps", "20"]) == 0
    cal = json.loads(capsys.readouterr().out)
    want = callback.history[0]
    assert cal["rows"] == want["calibration/completions"] == 24
    assert cal["accuracy"] == pytest.approx(want["calibration/accuracy"])
    keys = ("ece", "brier", "auroc", "mean_confidence", "confidence_missing_rate", "reflection_missing_rate",
            "reflection_accuracy", "overconfidence", "underconfidence")
    for key in keys:
        assert cal[key]["value"] == pytest.approx(want[f"calibration/{key}"]), key
    stated = sum(not math.isnan(r["confidence"]) for r in records)
    assert cal["reports"]["confidence"] == {"asked": 24, "stated": stated, "missing": 24 - stated,
                                            "accuracy": pytest.approx(np.mean([r["acc"] for r in records
                                                                               if not math.isnan(r["confidence"])]))}
    assert cal["ece"]["n"] == cal["auroc"]["n"] == stated < cal["confidence_missing_rate"]["n"] == 24


def test_rewards_against_hand_worked_values():
    task = get_task("arith")
    p = next(p for p in task.problems("train") if p.meta["ops"] == ["+"])
    right, wrong = str(p.meta["value"]), str(p.meta["value"] + 1)
    completions = [f"{right}<confidence>0.8</confidence>", f"{wrong}<confidence>0.8</confidence>", right,
                   [{"role": "assistant", "content": f"{right}<reflect>solved</reflect>"}]]
    ids = [p.id] * 4
    log = R.RewardLog()
    rlcr = R.rlcr_reward("arith", log=log)(completions=completions, problem_id=ids)
    assert rlcr == pytest.approx([1 - 0.2 ** 2, -(0.8 ** 2), -2.0, -2.0])
    assert R.brier_reward("arith")(completions=completions, problem_id=ids) == pytest.approx([-0.04, -0.64, 0, 0])
    assert R.reflection_reward("arith")(completions=completions, problem_id=ids) == pytest.approx([0, 0, 0, 0.1])
    assert R.format_reward("arith")(completions=completions, problem_id=ids) == [1.0, 1.0, 0.0, 0.0]
    assert R.outcome_reward("arith")(completions=completions, problem_id=ids) == [1.0, 0.0, 1.0, 1.0]
    assert [r["confidence"] for r in log.take()][:2] == [0.8, 0.8]
    with pytest.raises(Exception, match="not a problem of task 'arith'"):
        R.outcome_reward("arith")(completions=["1"], problem_id=["nope"])


def test_dataset_rows_and_the_collapse_alarm():
    ds = R.task_dataset("arith", self_report="confidence", limit=2)
    row = ds[0]
    assert row["problem_id"].startswith("arith:") and row["prompt"][0]["role"] == "user"
    assert "Reply with only the number" in row["prompt"][0]["content"] and "<confidence>P</confidence>" in \
        row["prompt"][0]["content"]
    same = [{"acc": float(i % 2), "reflection": math.nan, "confidence": 0.9} for i in range(8)]
    assert R.calibration_of(same)["calibration/collapse"] == 1.0
    varied = [dict(r, confidence=0.1 + 0.1 * i) for i, r in enumerate(same)]
    assert R.calibration_of(varied)["calibration/collapse"] == 0.0


@pytest.mark.slow
def test_the_example_on_the_real_model(tmp_path):
    """The example with SmolLM2-135M-Instruct through its chat template and a LoRA adapter, one step: TRL trains it
    and the callback logs the calibration of its completions (skipped where the model's package is missing)."""
    from reflectrl.errors import ConfigError
    from reflectrl.llm.models import resolve_model

    try:
        resolve_model("smollm2-135m-instruct")
    except ConfigError as exc:
        pytest.skip(str(exc))
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", "smollm2-135m-instruct", "--lora-r", "16", "--steps", "1", "--out", str(tmp_path)])
    assert [h["step"] for h in history] == [1] and history[0]["calibration/completions"] == 8
    assert 0.0 <= history[0]["calibration/accuracy"] <= 1.0


def test_the_reward_log_keeps_the_prompt_and_the_sampled_ids():
    """Where TRL passes the prompts and the completions' token ids, the records keep them as given: the dump shows
    what the model was asked and what it sampled, token for token."""
    task = get_task("arith")
    p = task.problems("train")[0]
    prompt = [{"role": "user", "content": "What is 1 + 1?"}]
    log = R.RewardLog()
    R.rlcr_reward("arith", log=log)(prompts=[prompt, prompt], completions=["2", "3"], problem_id=[p.id, p.id],
                                    completion_ids=[[17, 2], [18]])
    rows = log.take()
    assert [r["prompt"] for r in rows] == [prompt, prompt] and [r["completion_ids"] for r in rows] == [[17, 2], [18]]
    R.rlcr_reward("arith", log=log)(completions=["2"], problem_id=[p.id])  # a caller that passes neither
    assert "prompt" not in log.take()[0]


def test_the_inline_rollout_opens_the_tag_after_each_answer(tmp_path):
    """TRL with reflectrl's inline rollout on a chat model (a tiny one with SmolLM2's tokenizer and template): every
    completion is an answer, the opened tag (environment tokens, masked) and at most INLINE_REPORT_TOKENS report
    tokens; the reward scores the answer alone and reads the report as reflectrl's trainer does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reflectrl.integrations.trl_inline import inline_rollout
    from reflectrl.llm.models import named_tokenizer
    from reflectrl.tasks.selfreport import INLINE_OPENINGS, INLINE_REPORT_TOKENS, parse_inline

    tok = named_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = tmp_path / "chat"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048)
                     ).save_pretrained(model)
    tok.save_pretrained(model)
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", str(model), "--steps", "1", "--out", str(tmp_path / "out")])
    assert [h["step"] for h in history] == [1]
    rows = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    task = get_task("arith")
    problems = {p.id: p for s in ("train", "heldout") for p in task.problems(s)}
    opening = INLINE_OPENINGS["confidence"]
    assert len(rows) == 8
    for r in rows:
        answer, _, report = r["completion"].partition(opening)
        assert _ == opening and len(tok(report, add_special_tokens=False).input_ids) <= INLINE_REPORT_TOKENS
        assert r["outcome"] == task.score(problems[r["problem_id"]], answer)
        assert r["confidence"] == parse_inline("confidence", report)  # None where it wrote no digits

    class Trainer:  # what the rollout reads of TRL's trainer
        processing_class = tok
        generation_config = SimpleNamespace()

    from transformers import AutoModelForCausalLM, GenerationConfig

    t = Trainer()
    t.model = AutoModelForCausalLM.from_pretrained(model)
    t.accelerator = SimpleNamespace(unwrap_model=lambda m: m)
    t.generation_config = GenerationConfig(max_new_tokens=4, do_sample=True, eos_token_id=tok.eos_token_id,
                                           pad_token_id=tok.pad_token_id)
    out = inline_rollout("reflect")([[{"role": "user", "content": "What is 1 + 1?"}]] * 2, t)
    n_open = len(tok(INLINE_OPENINGS["reflect"], add_special_tokens=False).input_ids)
    for ids, mask, answer in zip(out["completion_ids"], out["env_mask"], out["inline_answer"]):
        a = len(tok(answer, add_special_tokens=False).input_ids)
        assert mask[:a] == [1] * a and mask[a:a + n_open] == [0] * n_open and len(ids) == len(mask)
    assert out["inline_kind"] == ["reflect", "reflect"] and out["logprobs"] is None


def test_rewards_on_a_dataset_of_ones_own_without_problem_ids(tmp_path):
    """A checker and an answer column replace the problem ids: the rewards read each row's reference from TRL's
    columns; hand-worked values."""
    completions = ["#### 1,000<confidence>0.9</confidence>", "999<confidence>0.9</confidence>",
                   [{"role": "assistant", "content": "\\boxed{12}<reflect>solved</reflect>"}], "no number"]
    answers = ["1000", "1000", "Ana has 12.\n#### 12", 7]
    log = R.RewardLog()
    assert R.rlcr_reward(checker="number", log=log)(completions=completions, answer=answers) == \
        pytest.approx([1 - 0.1 ** 2, -(0.9 ** 2), -2.0, -2.0])
    assert [r["outcome"] for r in log.take()] == [1.0, 0.0, 1.0, 0.0]
    assert R.outcome_reward(checker="exact", answer_column="gold")(completions=["Paris", "paris"],
                                                                    gold=["Paris", "Paris"]) == [1.0, 0.0]
    assert R.outcome_reward(checker="exact", checker_options={"ignore_case": True}, answer_column="gold")(
        completions=["Paris", "paris"], gold=["Paris", "Paris"]) == [1.0, 1.0]
    assert R.reflection_reward(checker="choice")(completions=["B <reflect>solved</reflect>", "Oslo<reflect>solved"
                                                              "</reflect>"], answer=["B", "Rome"],
                                                 choices=[["Rome", "Paris"], '["Rome", "Paris"]']) == \
        pytest.approx([0.1, 0.0])
    with pytest.raises(Exception, match="needs the dataset's 'answer' column"):
        R.outcome_reward(checker="number")(completions=["1"], solution=["1"])
    with pytest.raises(Exception, match="needs a task .* or a checker"):
        R.outcome_reward()


def test_task_dataset_of_the_data_task(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i),
                                        "split": "train"}) + "\n" for i in range(6)))
    ds = R.task_dataset("data", task_options={"path": str(path), "checker": "number"}, self_report="confidence")
    assert ds[0]["problem_id"] == "q0" and ds[0]["answer"] == "0" and len(ds) == 6
    assert ds[1]["prompt"][0]["content"].startswith("What is 1 + 1? Reply with only the number.")
    by_id = R.outcome_reward("data", task_options={"path": str(path), "checker": "number"})
    by_answer = R.outcome_reward(checker="number")
    completions = ["2", "3 <confidence>0.5</confidence>", "#### 6"]
    assert by_id(completions=completions, problem_id=ds["problem_id"][1:4]) == \
        by_answer(completions=completions, answer=ds["answer"][1:4]) == [1.0, 0.0, 1.0]


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    """A user's JSON lines file of word problems (question, answer) and a tiny model warmed up on it to end its
    answers with <confidence>q</confidence>."""
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup

    root = tmp_path_factory.mktemp("trl_data")
    rng = np.random.default_rng(0)
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in rng.integers(0, 10, (300, 2))]
    path = root / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = (f"path={path}", "checker=number")
    tiny = init_tiny(root / "tiny", layers=1, width=32, heads=2, max_positions=256, seed=0)
    warmup(WarmupConfig(model=str(tiny), task="data", task_options=options, out=str(root / "warm"), steps=300,
                        batch_size=32, learning_rate=3e-3, self_report="inline", progress=False))
    return path, root / "warm"


def test_the_example_on_a_users_jsonl_logs_what_reflectrl_calibration_reads(users_file, tmp_path, capsys):
    """``--task data --set path=FILE``: TRL's GRPOTrainer runs rlcr_reward on the user's rows, and each step's logged
    ECE (and accuracy, AUROC) equals ``reflectrl calibration`` on that step's dumped rows."""
    path, warm = users_file
    mod = runpy.run_path(str(ROOT / "examples" / "trl_rlcr.py"))
    history = mod["main"](["--model", str(warm), "--steps", "3", "--out", str(tmp_path), "--task", "data", "--set",
                           f"path={path}", "--set", "checker=number"])
    assert [h["step"] for h in history] == [1, 2, 3]
    kept = _strict_lines(tmp_path / "completions.jsonl")
    task = get_task("data", path=str(path), checker="number")
    answers = {p.id: p.answer for s in ("train", "validation", "heldout") for p in task.problems(s)}
    assert all(r["problem_id"] in answers for r in kept) and len(kept) == 24
    stated = 0
    for h in history:
        rows = [r for r in kept if r["step"] == h["step"]]
        # the outcome is the checker's on the file's own answer, not a reward's echo
        assert [r["acc"] for r in rows] == [task.check.score(r["completion"], answers[r["problem_id"]]) for r in rows]
        step = R.write_records(tmp_path / f"step{h['step']}.jsonl", rows)
        capsys.readouterr()
        assert cli_main(["calibration", str(step), "--json", "--reps", "20"]) == 0
        cal = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert cal["rows"] == h["calibration/completions"] == 8
        assert cal["accuracy"] == pytest.approx(h["calibration/accuracy"])
        stated += cal["ece"]["n"] or 0
        for key in ("ece", "auroc", "brier"):
            logged = h.get(f"calibration/{key}")
            assert cal[key]["value"] == pytest.approx(logged) if logged is not None else cal[key]["value"] is None
    assert stated > 0  # the warmed-up model states confidences: the ECE compared is not of empty reports
