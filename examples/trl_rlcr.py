"""RLCR inside TRL: TRL's GRPOTrainer with reflectrl's rlcr reward and calibration callback, on the CPU.

    python examples/trl_rlcr.py --out runs/trl_rlcr                              # a tiny model reflectrl makes
    python examples/trl_rlcr.py --model smollm2-135m-instruct --lora-r 16 --out runs/trl_rlcr_smol
    python examples/trl_rlcr.py --task data --set path=problems.jsonl --set checker=number --out runs/trl_data

The prompts ask for the answer and a confidence in the same reply (``<confidence>P</confidence>``); the reward is
RLCR's ``acc - (q - acc)^2`` (-2 without a confidence), scored by the task's own verifier (``--task``, default
arith; ``--set KEY=VALUE`` its options); the callback logs the calibration of the confidences each logging step
(``calibration/ece``, ``calibration/auroc``, ...) into
``trainer.state.log_history`` and ``OUT/calibration.jsonl``, and the completions they were computed from go to
``OUT/completions.jsonl`` (strict JSON, a confidence not stated as null: ``reflectrl calibration
OUT/completions.jsonl`` reads it, and on one step's rows gives the ECE logged for that step). A user's own file of
questions and answers runs through ``--task data --set path=FILE --set checker=NAME`` (docs/data.md): its rows are
the dataset, and the checker scores each completion against the row's answer. The last line printed is a JSON
list of the logged records. A model without a chat template gets raw prompts: warm it up to state the tag first
(``reflectrl llm warmup --self-report inline``).
Sampling follows the model as reflectrl's trainer does (temperature 0.6 for a pretrained model, 1.0 for a tiny one;
64 completion tokens for a pretrained model). A chat model gets the inline form (``--form inline``, its default): a
base SmolLM2-135M-Instruct writes no tag from the instruction alone (BENCHMARKS.md, "The inline form"), so TRL's
``rollout_func`` is :func:`reflectrl.integrations.trl_inline.inline_rollout`, which opens the tag after each answer
in the same message, as reflectrl's own trainer does (``--self-report inline``), and the model writes its
confidence there. ``--form tag``: TRL generates each completion in one piece and the tag must come from the model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (TRL's output_dir and calibration.jsonl)")
    ap.add_argument("--model", default=None, help="a model folder or a reflectrl named model (default: a new tiny one)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: every weight)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: reflectrl's for the model)")
    ap.add_argument("--task", default="arith", help="a reflectrl task (reflectrl tasks lists them)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a task option (repeatable)")
    ap.add_argument("--form", choices=("auto", "inline", "tag"), default="auto",
                    help="inline: the tag opened after the answer by the rollout; tag: written by the model; auto: "
                         "inline for a model with a chat template")
    a = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.trl import CalibrationCallback, RewardLog, rlcr_reward, task_dataset, write_records
    from reflectrl.integrations.trl_inline import inline_rollout
    from reflectrl.llm.models import has_chat_template, model_defaults, profile_of, resolve_model
    from reflectrl.tasks.base import parse_options

    options = parse_options(a.set)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.model is None:
        from reflectrl.llm.tiny import init_tiny

        a.model = str(init_tiny(out / "tiny", layers=1, width=32, heads=2, max_positions=256, force=True))
    path = resolve_model(a.model)
    profile = profile_of(path, lora=a.lora_r > 0)
    defaults = model_defaults(profile)  # the model's own sampling settings, which TRL does not know
    lr = a.lr or defaults["learning_rate"]
    log = RewardLog()
    callback = CalibrationCallback(log, jsonl=str(out / "calibration.jsonl"), keep=True)
    args = GRPOConfig(output_dir=str(out / "trl"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=64 if profile.pretrained_scale else 32, max_steps=a.steps,
                      learning_rate=lr, logging_steps=1, beta=0.0, use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", seed=0, temperature=defaults["temperature"],
                      dataloader_num_workers=0)
    peft = None
    if a.lora_r:
        from peft import LoraConfig

        peft = LoraConfig(r=a.lora_r, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    chat = has_chat_template(path)
    inline = a.form == "inline" or (a.form == "auto" and chat)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), processing_class=tok,
                          reward_funcs=[rlcr_reward(a.task, options, log=log)], args=args, peft_config=peft,
                          train_dataset=task_dataset(a.task, self_report="inline" if inline else "confidence",
                                                     task_options=options, chat=chat),
                          rollout_func=inline_rollout("confidence") if inline else None, callbacks=[callback])
    trainer.train()
    write_records(out / "completions.jsonl", callback.kept)  # what the metrics were computed from, to check them
    print(json.dumps(callback.history))
    return callback.history


if __name__ == "__main__":
    main()
