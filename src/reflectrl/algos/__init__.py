"""The composition root: every built-in algorithm of both front ends, registered in one place (PPO at
once, the others when a lookup first needs them: a front end's modules are imported only when one of
its algos is used), and the lookups and resume that the CLI, ``compare`` and library users call.

An entry is one :class:`~reflectrl.algos.registry.Algo`: its config dataclass, the defaults it applies and
how to build its trainer. A method of a user's own is one file plus one
:func:`~reflectrl.algos.registry.register_algo` call (docs/architecture.md shows one); it then trains,
appears in ``--algo``'s choices and resumes as itself, like these.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import load_checkpoint
from ..control.config import PPOConfig
from ..control.ppo import PPO
from ..errors import CheckpointError
from ..trainer import CHECKPOINT, Trainer, extend_budget, load_config, read_config_json, run_kind
from .registry import Algo, algo_table, lookup, register_algo, register_builtins, register_implied_defaults

if TYPE_CHECKING:
    from ..llm.config import GRPOConfig

# ----------------------------------------------------------------------------- control front end
# PPO is registered at once; the other built-ins of each front end are registered by a loader that the
# registry runs the first time a lookup needs them (registry.register_builtins), so that `reflectrl train
# --algo ppo` imports neither the LLM front end nor the method families.
register_algo(Algo("ppo", "control", PPOConfig, lambda cfg: PPO(cfg),
                   "PPO with GAE (truncation bootstrap) and the clipped objective"))


def _register_control() -> None:
    """DQN and the control methods."""
    from ..control.dqn import DQN, DQNConfig
    from .control import (
        ExGRPOSeedConfig,
        ExGRPOSeedDQNConfig,
        GearSeedConfig,
        RefGRPOSeedConfig,
        exgrpo_dqn_hooks,
        exgrpo_methods,
        gear_methods,
        refgrpo_methods,
    )

    register_algo(Algo("dqn", "control", DQNConfig, lambda cfg: DQN(cfg),
                       "DQN with replay, target network and epsilon-greedy (CleanRL dqn.py defaults)"))
    register_algo(Algo("refgrpo-seed", "control", RefGRPOSeedConfig, lambda cfg: PPO(cfg, refgrpo_methods(cfg)),
                       "PPO + calibration bonus from a reflection predictor (seed 000)"))
    register_algo(Algo("gear-seed", "control", GearSeedConfig, lambda cfg: PPO(cfg, gear_methods(cfg)),
                       "PPO + advantages reweighted by a value head distilled from group winners (seed 001)"))
    register_algo(Algo("exgrpo-seed", "control", ExGRPOSeedConfig, lambda cfg: PPO(cfg, exgrpo_methods(cfg)),
                       "PPO + trajectory reflection term from a prioritized reflection memory (seed 003)"))
    register_algo(Algo("exgrpo-seed-dqn", "control", ExGRPOSeedDQNConfig,
                       lambda cfg: DQN(cfg, hooks=exgrpo_dqn_hooks(cfg)),
                       "DQN + eta * Q_refl(s, a) in the TD target from a reflection memory (seed 003)"))


# ----------------------------------------------------------------------------- LLM front end
def _register_llm() -> None:
    """Every built-in of the LLM front end."""
    from ..llm.config import GRPOConfig
    from ..llm.grpo import GRPO
    from ..llm.models import implied_llm_defaults
    from .llm import (
        EXGRPO_DEFAULTS,
        GEAR_SEED_DEFAULTS,
        REFGRPO_DEFAULTS,
        RLCR_DEFAULTS,
        ExGRPOConfig,
        ExGRPOSeedLLMConfig,
        GEARConfig,
        GearSeedLLMConfig,
        RefGRPOConfig,
        RefGRPOSeedLLMConfig,
        RLCRConfig,
        exgrpo_llm_hooks,
        exgrpo_seed_llm_parts,
        gear_llm_parts,
        gear_seed_llm_methods,
        refgrpo_llm_methods,
        refgrpo_seed_llm_methods,
        rlcr_llm_methods,
    )

    register_implied_defaults("llm", implied_llm_defaults)
    register_algo(Algo("grpo", "llm", GRPOConfig, lambda cfg: GRPO(cfg),
                       "GRPO: group mean/std advantages, seq-mean-token-mean loss"))
    register_algo(Algo("drgrpo", "llm", GRPOConfig, lambda cfg: GRPO(cfg),
                       "Dr.GRPO: mean-centred advantages, no length normalization (seq-mean-token-sum-norm)",
                       {"adv_estimator": "drgrpo", "loss_agg_mode": "seq-mean-token-sum-norm"}))
    register_algo(Algo("dapo", "llm", GRPOConfig, lambda cfg: GRPO(cfg),
                       "DAPO-style: clip-higher 0.28, token-mean loss, zero-variance groups filtered and refilled",
                       {"clip_high": 0.28, "loss_agg_mode": "token-mean", "filter_zero_std": True,
                        "max_gen_batches": 10}))
    register_algo(Algo("refgrpo", "llm", RefGRPOConfig, lambda cfg: GRPO(cfg, methods=refgrpo_llm_methods(cfg)),
                       "GRPOplus + reflection-agreement bonus c * 1[reflection == outcome] (arXiv 2606.14211)",
                       REFGRPO_DEFAULTS))
    register_algo(Algo("rlcr", "llm", RLCRConfig, lambda cfg: GRPO(cfg, methods=rlcr_llm_methods(cfg)),
                       "GRPO + Brier calibration reward 1[correct] - (q - 1[correct])^2 (arXiv 2507.16806)", RLCR_DEFAULTS))
    register_algo(Algo("refgrpo-seed", "llm", RefGRPOSeedLLMConfig,
                       lambda cfg: GRPO(cfg, methods=refgrpo_seed_llm_methods(cfg)),
                       "GRPO + calibration bonus from a reflection predictor on hidden states (seed 000, section 6)"))
    register_algo(Algo("gear-seed", "llm", GearSeedLLMConfig, lambda cfg: GRPO(cfg, methods=gear_seed_llm_methods(cfg)),
                       "GRPO + token advantages reweighted by a value head distilled from group winners (seed 001)",
                       GEAR_SEED_DEFAULTS))
    register_algo(Algo("gear", "llm", GEARConfig,
                       lambda cfg: GRPO(cfg, *gear_llm_parts(cfg)),
                       "GRPO + self-teacher divergence segments modulating the group advantage (arXiv 2605.11853)"))
    register_algo(Algo("exgrpo", "llm", ExGRPOConfig, lambda cfg: GRPO(cfg, hooks=exgrpo_llm_hooks(cfg)),
                       "Dr.GRPO + replay of successful trajectories of partially solved questions (arXiv 2510.02245)",
                       EXGRPO_DEFAULTS))
    register_algo(Algo("exgrpo-seed", "llm", ExGRPOSeedLLMConfig, lambda cfg: GRPO(cfg, *exgrpo_seed_llm_parts(cfg)),
                       "GRPO + trajectory reflection term from a prioritized reflection memory on hidden states (seed 003)"))


register_builtins("control", _register_control)
register_builtins("llm", _register_llm)

# ----------------------------------------------------------------------------- a user's own modules
def load_plugins(spec: str | None = None) -> list[str]:
    """Import the modules named in ``REFLECTRL_PLUGINS`` (comma-separated; or ``spec``): a method of a user's own
    registers there with :func:`~reflectrl.algos.registry.register_algo` and is then an ``--algo`` of the CLI, of
    ``compare`` (its runs inherit the environment) and of ``--resume``."""
    import importlib
    import os

    from ..errors import ConfigError

    names = [n.strip() for n in (spec if spec is not None else os.environ.get("REFLECTRL_PLUGINS", "")).split(",")
             if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"REFLECTRL_PLUGINS names {name!r}, which cannot be imported ({exc})") from None
    return names


load_plugins()


# ----------------------------------------------------------------------------- lookups
def get_algo(kind: str, name: str) -> Algo:
    """The ``--algo NAME`` entry of a front end (``control`` or ``llm``), or ConfigError listing the choices."""
    return lookup(kind, name)


def algo_names(kind: str) -> list[str]:
    return sorted(algo_table(kind))


def config_for_algo(algo: str, **overrides: Any) -> GRPOConfig:
    """An LLM algo's config: GRPOConfig with the defaults of ``algo``, then ``overrides``."""
    return get_algo("llm", algo).config(**overrides)


def build(kind: str, name: str, cfg: Any) -> Trainer:
    """The trainer of algo ``name`` for ``cfg``."""
    return get_algo(kind, name).make(cfg)


def run_algo(run_dir: str | Path) -> Algo:
    """The algo a run directory was trained with (``ppo`` / ``grpo`` for runs that predate the field)."""
    raw = read_config_json(run_dir)
    kind = run_kind(raw)
    return get_algo(kind, str(raw.get("algo") or ("ppo" if kind == "control" else "grpo")))


def resume(run_dir: str | Path, budget: int | None = None, **overrides: Any) -> Trainer:
    """Rebuild a run's trainer from ``RUN_DIR/config.json`` and its latest checkpoint, as the algo it was
    started with, optionally for a larger budget (``total_timesteps`` or ``updates``); ``overrides``
    replace config fields that do not change what is trained (progress bar, time limits, model path)."""
    run_dir = Path(run_dir)
    algo = run_algo(run_dir)
    cfg = load_config(run_dir, algo.config_cls)
    if not (run_dir / CHECKPOINT).is_file():
        raise CheckpointError(f"{run_dir} has no checkpoint yet (the run stopped before its first save): "
                              "start it again instead of resuming")
    tensors, meta = load_checkpoint(run_dir / CHECKPOINT)
    field = cfg.budget_field
    done = int(meta.get("global_step", 0)) if field == "total_timesteps" else int(meta.get("update", 0))
    flag = "--" + field.replace("_", "-")
    extend_budget(cfg, budget, done, field, flag)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir), **overrides)
    trainer = algo.make(cfg)
    trainer.load_run(run_dir, (tensors, meta))
    return trainer
