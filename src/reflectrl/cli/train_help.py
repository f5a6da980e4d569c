"""The ``--help`` of ``reflectrl llm train`` and of ``reflectrl train``, their flags in groups: the common ones first,
then the method's own options under its name, then the base algorithm's (GRPO's; PPO's or DQN's) by what they set
(rollout, loss, update, logging).

The flags are tyro's (both commands parse with it): one per field of the algo's config, named as tyro names
it (``--run-dir``; a boolean as ``--x, --no-x``), its help the field's docstring and its default the config's, a
recipe's and the model's defaults included. Only the layout is this module's; a test checks that it lists the flags
tyro takes, no more and no fewer.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any

COMMON = ("task", "model", "run_dir", "updates", "cpu_time_limit_s", "time_limit_s", "seed", "lora_r", "learning_rate",
          "prompts_per_update", "group_size", "self_report", "threads", "device", "progress")
GROUPS: dict[str, tuple[str, ...]] = {
    "rollout options": (
        "task_options", "chat", "max_new_tokens", "max_turns", "max_response_tokens", "temperature", "top_k", "engine",
        "engine_options", "gen_batch", "reward_workers", "sandbox_batch", "reward_cache", "filter_zero_std",
        "max_gen_batches", "old_logp", "tis_cap"),
    "loss and advantage options": (
        "adv_estimator", "loss_agg_mode", "norm_len", "clip_low", "clip_high", "clip_c", "log_ratio_clamp", "policy_loss",
        "kl_coef", "kl_estimator", "entropy_coef", "report_entropy_coef", "gamma", "lam", "whiten", "vf_coef",
        "value_clip"),
    "optimizer and update options": (
        "lr_schedule", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "max_grad_norm", "ppo_epochs",
        "minibatches", "grad_accum", "micro_batch_tokens", "dedupe", "attention", "lora_alpha", "lora_dropout", "dtype"),
    "evaluation, logging and checkpoint options": (
        "eval_interval", "eval_problems", "eval_split", "sample_interval", "samples_per_log", "save_interval",
        "export_model", "tensorboard", "track", "wandb_project_name", "on_nonfinite", "collapse_alarm_updates",
        "collapse_alarm_spread", "model_name"),
}
CONTROL_COMMON = ("env_id", "total_timesteps", "seed", "run_dir", "learning_rate", "num_envs", "num_steps",
                  "cpu_time_limit_s", "time_limit_s", "threads", "progress")
CONTROL_GROUPS: dict[str, tuple[str, ...]] = {
    "rollout options": (
        "gamma", "gae_lambda", "bootstrap_truncation", "normalize_obs", "normalize_reward", "seed_group_size",
        "env_workers"),
    "loss and update options": (
        "update_epochs", "num_minibatches", "anneal_lr", "norm_adv", "clip_coef", "clip_coef_high", "clip_vloss",
        "ent_coef", "vf_coef", "max_grad_norm", "target_kl"),
    "replay and exploration options": (
        "buffer_size", "batch_size", "learning_starts", "train_frequency", "start_e", "end_e", "exploration_fraction",
        "tau", "target_network_frequency"),
    "network options": ("hidden_sizes", "activation", "ortho_init", "log_std_init"),
    "logging and checkpoint options": (
        "exp_name", "save_interval", "log_interval", "on_nonfinite", "tensorboard", "track", "wandb_project_name"),
}
FRONT_ONLY = ("algo",)
"""Fields set by a flag of the command itself (``--algo``), listed with the common flags."""


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's docstring (the string literal after it), over ``cls`` and its bases, one line each."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:]):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                out[a.target.id] = " ".join(b.value.value.split())
    return out


def owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that declares field ``name``."""
    return next(k for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {}))


def _metavar(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    if origin in (tuple, list):
        inner = _metavar(args[0]) if args else "STR"
        return f"[{inner} [{inner} ...]]"
    if args == [bool] and type(None) in typing.get_args(tp):  # bool | None: tyro takes the three words
        return "{None,True,False}"
    if args and len(args) == 1 and type(None) in typing.get_args(tp):  # X | None
        return _metavar(args[0])
    return {int: "INT", float: "FLOAT", str: "STR"}.get(tp, "VALUE")


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value) or "none"
    return repr(value) if value == "" else str(value)


def _add(group: Any, f: dataclasses.Field, tp: Any, doc: str, default: Any) -> None:
    flag = "--" + f.name.replace("_", "-")
    # a field without a docstring shows its default alone, which tests/test_cli.py refuses
    text = f"{doc} (default: {_shown(default)})".strip().replace("%", "%%")
    if tp is bool:
        group.add_argument(flag, f"--no-{flag[2:]}", action="store_true", help=text)
    else:
        group.add_argument(flag, metavar=_metavar(tp), help=text)


def _grouped(ap: argparse.ArgumentParser, algo: Any, default: Any, common_names: tuple[str, ...],
             base: tuple[type, ...], groups: dict[str, tuple[str, ...]], front: list[tuple[str, str, str]]) -> None:
    """Add ``default``'s fields to ``ap``: under "common options", ``-h``, the command's own flags ``front`` (flag,
    metavar, help) and the fields ``common_names``; the method's own fields (declared by none of ``base``) under its
    name; then ``groups``; the rest as "other options"."""
    cls = type(default)
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in FRONT_ONLY}
    add = lambda group, name: _add(group, fields.pop(name), hints[name], docs.get(name, ""),  # noqa: E731
                                   getattr(default, name))
    common = ap.add_argument_group("common options")
    common.add_argument("-h", "--help", action="store_true", help="show this help message and exit")
    for flag, metavar, text in front:
        common.add_argument(flag, metavar=metavar, help=text.replace("%", "%%"))
    for name in common_names:
        if name in fields:
            add(common, name)
    own = [n for n in fields if not any(issubclass(b, owner(cls, n)) for b in base)]
    if own:
        doc = " ".join((cls.__doc__ or "").split()).replace("%", "%%")
        method = ap.add_argument_group(f"{algo.name} options", doc or None)
        for name in own:
            add(method, name)
    for title, names in [*groups.items(), ("other options", tuple(fields))]:
        present = [n for n in names if n in fields]
        group = ap.add_argument_group(title) if present else None
        for name in present:
            add(group, name)


def _methods(kind: str, algos: list[str]) -> str:
    from ..algos import get_algo

    methods = [(n, get_algo(kind, n).description) for n in algos]
    width = max(len(n) for n, _ in methods)
    return "\nmethods (--algo):\n" + "".join(f"  {n:<{width}}  {d}\n" for n, d in methods)


def train_help(algo: Any, default: Any, algos: list[str], recipes: list[str]) -> str:
    """The grouped help of ``reflectrl llm train --algo ALGO`` with ``default``'s values as the defaults."""
    from ..llm.config import GRPOConfig

    ap = argparse.ArgumentParser(
        prog=f"reflectrl llm train --algo {algo.name}", add_help=False,
        usage="%(prog)s [--recipe NAME] --task TASK --model PATH [FLAGS]\n       reflectrl llm train --resume RUN_DIR "
              "[--updates N] [--time-limit-s S] [--cpu-time-limit-s S] [--no-progress] [--model PATH]",
        description=f"Train a causal LM by RL on a verifiable task. {algo.name}: {algo.description}. --algo applies its "
                    "method's defaults, --recipe a recipe's settings; explicit flags override both. --resume RUN_DIR "
                    "continues an interrupted or finished run.".replace("%", "%%"))
    _grouped(ap, algo, default, COMMON, (GRPOConfig,), GROUPS, [
        ("--algo", "{" + ",".join(algos) + "}",
         f"the method; its defaults apply under explicit flags (default: a recipe's, else grpo; now {algo.name})"),
        ("--recipe", "NAME", "start from a recipe's settings (" + ", ".join(recipes) + "; `reflectrl llm recipes` "
         "lists them with what each reached); explicit flags override them"),
        ("--resume", "RUN_DIR", "continue a run from its latest checkpoint, as it was configured (only the flags of "
         "the second usage line go with it)"),
        ("--set", "KEY=VALUE", "a task option, repeatable (`reflectrl tasks show TASK` lists them; --task-options is "
         "an alias)")])
    return ap.format_help() + _methods("llm", algos)


def control_train_help(algo: Any, default: Any, algos: list[str], presets: list[str]) -> str:
    """The grouped help of ``reflectrl train --algo ALGO`` with ``default``'s values (a preset's included) as the
    defaults."""
    from ..control.config import PPOConfig
    from ..control.dqn import DQNConfig

    ap = argparse.ArgumentParser(
        prog=f"reflectrl train --algo {algo.name}", add_help=False,
        usage="%(prog)s [--preset NAME] [FLAGS]\n       reflectrl train --resume RUN_DIR [--total-timesteps N] "
              "[--time-limit-s S] [--cpu-time-limit-s S] [--no-progress]",
        description=f"Train an agent on a Gymnasium environment. {algo.name}: {algo.description}. --preset NAME starts "
                    "from a preset's settings (named after its env id); explicit flags override it. Flags use "
                    "CleanRL's names; a default of None is CleanRL's for the env's action space. --resume RUN_DIR "
                    "continues an interrupted or finished run.".replace("%", "%%"))
    _grouped(ap, algo, default, CONTROL_COMMON, (PPOConfig, DQNConfig), CONTROL_GROUPS, [
        ("--algo", "{" + ",".join(algos) + "}",
         f"the method; its defaults apply under explicit flags (default: ppo; now {algo.name})"),
        ("--preset", "NAME", "start from a preset's settings (" + ", ".join(presets) + "; `reflectrl presets` prints "
         "their values); explicit flags override them"),
        ("--resume", "RUN_DIR", "continue a run from its latest checkpoint, as it was configured (only the flags of "
         "the second usage line go with it)")])
    return ap.format_help() + _methods("control", algos)


__all__ = ["COMMON", "CONTROL_COMMON", "CONTROL_GROUPS", "GROUPS", "control_train_help", "field_docs", "train_help"]
