"""A LoRA run exports its adapter alone, which every loader of a model folder reads as the trained policy;
`reflectrl llm export` refreshes it or merges it into a plain Hugging Face model; a run with no model to load says why."""

import json

import pytest
import torch

from reflectrl.algos import config_for_algo
from reflectrl.cli import main
from reflectrl.llm.batch import RowResult, Segment, build_batch
from reflectrl.llm.evaluate import load_for_eval
from reflectrl.llm.grpo import GRPO, GRPOHook
from reflectrl.llm.policy import load_policy


def one_error(capsys, argv, pattern):
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert pattern in lines[0], lines[0]


def lora_cfg(tiny_dir, run, **kw):
    # gae: a value head whose loss moves the adapter although the random model scores 0 everywhere
    base = dict(task="toy-add", model=str(tiny_dir), run_dir=str(run), updates=2, prompts_per_update=2, group_size=2,
                max_new_tokens=3, lora_r=2, adv_estimator="gae", learning_rate=0.05, progress=False, tensorboard=False,
                reward_workers=0)
    return config_for_algo("grpo", **{**base, **kw})


def probe():
    return build_batch([RowResult([1, 5, 6, 2], [Segment([7, 8, 9], "policy", 0)], None, 0.0, False, False, [])],
                       [0], [], 0)


def logits(model, ids=(1, 5, 6, 2, 7, 8, 9)):
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits


@pytest.fixture(scope="module")
def lora_run(tiny_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora") / "run"
    trainer = GRPO(lora_cfg(tiny_dir, run))
    trainer.learn()
    trainer.policy.eval()
    return run, trainer.policy


def test_a_lora_run_exports_its_adapter_which_loads_as_the_trained_policy(lora_run, tiny_dir):
    run, trained = lora_run
    files = {p.name for p in (run / "model").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "reflectrl_adapter.json",
            "reflectrl_heads.safetensors"} <= files and "model.safetensors" not in files and "config.json" not in files
    info = json.loads((run / "model" / "reflectrl_adapter.json").read_text())
    assert info == {"base_model": str(tiny_dir.resolve()), "base_name": None}
    peft_cfg = json.loads((run / "model" / "adapter_config.json").read_text())
    assert peft_cfg["base_model_name_or_path"] == str(tiny_dir.resolve())
    adapter = (run / "model" / "adapter_model.safetensors").stat().st_size
    assert adapter * 4 < (tiny_dir / "model.safetensors").stat().st_size
    assert any(float(p.detach().abs().max()) > 0 for n, p in trained.named_parameters() if "lora_B" in n)  # trained
    batch = probe()
    with torch.no_grad():
        want = trained.forward_batch(batch, with_hidden=True)
        value = trained.head("value", want.hidden)
        for loaded in (load_policy(run / "model"), load_policy(run), load_for_eval(run / "model")[0],
                       load_for_eval(run)[0]):
            loaded.eval()
            got = loaded.forward_batch(batch, with_hidden=True)
            assert torch.allclose(got.logp, want.logp, atol=1e-5)
            assert torch.allclose(loaded.head("value", got.hidden), value, atol=1e-5)
    base = load_policy(tiny_dir)
    with torch.no_grad():
        assert not torch.allclose(base.forward_batch(batch).logp, want.logp, atol=1e-3)
    # the settings that follow the model read the base model's config
    from reflectrl.llm.models import profile_of

    assert profile_of(str(run / "model"), lora=True) == profile_of(str(tiny_dir), lora=True)


def test_eval_of_the_run_its_adapter_and_its_merged_export_agree(lora_run, tmp_path, capsys):
    run, trained = lora_run
    outs = {}
    for name, target in (("run", run), ("adapter", run / "model"), ("merged", run / "merged")):
        if name == "merged":
            assert main(["llm", "export", str(run), "--merge"]) == 0
            summary = json.loads(capsys.readouterr().out)
            assert summary["format"] == "merged" and summary["out"] == str(run / "merged")
        path = tmp_path / f"{name}.jsonl"
        assert main(["llm", "eval", str(target), "--task", "toy-add", "--max-new-tokens", "3", "--json",
                     "--no-progress", "--transcripts", str(path)]) == 0
        res = json.loads(capsys.readouterr().out)
        outs[name] = (res["accuracy"], res["n"], [json.loads(line)["transcript"] for line in path.read_text().splitlines()])
    assert outs["run"] == outs["adapter"] == outs["merged"]
    # the merged export is a plain Hugging Face model directory with the trained logits
    from transformers import AutoModelForCausalLM

    merged = run / "merged"
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    assert torch.allclose(logits(plain), logits(trained.model), atol=1e-5)
    assert (merged / "model.safetensors").stat().st_size > 4 * (run / "model" / "adapter_model.safetensors").stat().st_size


def test_export_refreshes_the_adapter_and_keeps_a_full_run_full(lora_run, tiny_dir, tmp_path, capsys):
    run, trained = lora_run
    before = (run / "model" / "adapter_model.safetensors").read_bytes()
    (run / "model" / "adapter_model.safetensors").unlink()
    assert main(["llm", "export", str(run)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "adapter" and summary["base_model"] == str(tiny_dir.resolve())
    from safetensors.torch import load

    got, want = load((run / "model" / "adapter_model.safetensors").read_bytes()), load(before)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    # another folder: written where empty, refused where it holds files (unless --force), never the base model
    out = tmp_path / "elsewhere"
    assert main(["llm", "export", str(run), "--out", str(out)]) == 0
    capsys.readouterr()
    one_error(capsys, ["llm", "export", str(run), "--out", str(out)], "is not empty")
    assert main(["llm", "export", str(run), "--out", str(out), "--force", "--merge"]) == 0
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    capsys.readouterr()
    one_error(capsys, ["llm", "export", str(run), "--out", str(tiny_dir), "--force"], "is the run's base model")
    # full fine-tuning: the whole model, as before
    full = tmp_path / "full"
    GRPO(lora_cfg(tiny_dir, full, lora_r=0, adv_estimator="grpo", learning_rate=1e-3, updates=1)).learn()
    assert (full / "model" / "model.safetensors").is_file() and not (full / "model" / "adapter_config.json").exists()
    assert main(["llm", "export", str(full), "--merge"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == "full" and summary["out"] == str(full / "model")
    assert (full / "model" / "model.safetensors").is_file() and not (full / "merged").exists()


def test_an_adapter_whose_base_moved_says_how_to_load_it(lora_run, tiny_dir, tmp_path, capsys):
    import shutil

    run, _ = lora_run
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    info = json.loads((copy / "model" / "reflectrl_adapter.json").read_text())
    info["base_model"] = str(tmp_path / "gone")
    (copy / "model" / "reflectrl_adapter.json").write_text(json.dumps(info))
    one_error(capsys, ["llm", "eval", str(copy / "model"), "--task", "toy-add", "--no-progress"],
              f"is a LoRA adapter on {tmp_path / 'gone'}, which does not exist (moved?): write it again with "
              f"`reflectrl llm export {copy} --model PATH`")


class Stop(GRPOHook):
    """Stops the run (as a kill would) in update ``at`` before it trains."""

    def __init__(self, at):
        self.at = at

    def select_problems(self, trainer, n):
        if trainer.update_idx >= self.at:
            raise KeyboardInterrupt
        return None


def test_a_run_with_no_checkpoint_or_no_export_says_which(tiny_dir, tmp_path, capsys):
    early = tmp_path / "early"
    with pytest.raises(KeyboardInterrupt):
        GRPO(lora_cfg(tiny_dir, early, save_interval=5, updates=4), hooks=[Stop(1)]).learn()
    said = f"{early} has no checkpoint yet: it stopped before its first update"
    for argv in (["llm", "eval", str(early)], ["llm", "eval", str(early), "--task", "toy-add"], ["llm", "export", str(early)],
                 ["llm", "warmup", "--model", str(early), "--task", "toy-add", "--out", str(tmp_path / "w")]):
        one_error(capsys, argv, said)
    later = tmp_path / "later"
    with pytest.raises(KeyboardInterrupt):
        GRPO(lora_cfg(tiny_dir, later, save_interval=5, updates=4), hooks=[Stop(3)]).learn()
    one_error(capsys, ["llm", "eval", str(later)], f"{later} has no checkpoint yet: it stopped after 2 updates, "
                                                    "before its first checkpoint")
    # a checkpoint and no export: eval evaluates the checkpoint; as a model to start from, export it first
    stopped = tmp_path / "stopped"
    GRPO(lora_cfg(tiny_dir, stopped, export_model=False, updates=1)).learn()
    assert not (stopped / "model").exists()
    assert main(["llm", "eval", str(stopped), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 16
    one_error(capsys, ["llm", "warmup", "--model", str(stopped), "--task", "toy-add", "--out", str(tmp_path / "w")],
              f"{stopped} has a checkpoint but no exported model: write it with `reflectrl llm export {stopped}`")
    assert main(["llm", "export", str(stopped)]) == 0
    capsys.readouterr()
    assert main(["llm", "warmup", "--model", str(stopped), "--task", "toy-add", "--out", str(tmp_path / "w"),
                 "--steps", "1", "--no-progress"]) == 0
