"""The self-assessment methods on the LLM front end: one config dataclass per method (a GRPOConfig
subclass, so every option is a ``reflectrl llm train --algo NAME`` flag) and the method runners each
builds for a run; the composition root :mod:`reflectrl.algos` registers them. The learned parts are the
same classes as on the control front end (:mod:`reflectrl.methods.refgrpo_seed`, ...), reading the policy's
hidden states instead of observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..contract.base import MethodRunner, method_seed
from ..llm.config import GRPOConfig
from ..methods.exgrpo import ExGRPO, ExGRPOOptions
from ..methods.exgrpo_seed import ExGRPOSeed, ExGRPOSeedOptions
from ..methods.gear import GEAR, GEAROptions
from ..methods.gear_seed import GearSeed, GearSeedOptions
from ..methods.refgrpo import RefGRPO, RefGRPOOptions
from ..methods.refgrpo_seed import RefGRPOSeed, RefGRPOSeedOptions
from ..methods.rlcr import RLCR, RLCROptions
from ..trainer import check_all

if TYPE_CHECKING:
    from ..llm.grpo import GRPO


@dataclass
class RefGRPOConfig(RefGRPOOptions, GRPOConfig):
    """refgrpo: GRPO with a reflection-agreement bonus (arXiv 2606.14211); GRPOplus defaults (length-normalized
    loss, clip-higher, no KL); the environment asks for a reflection after each episode."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_refgrpo() + [
            (self.self_report in ("reflect", "inline-reflect"), "refgrpo needs --self-report reflect or inline-reflect"),
            (self.refgrpo_credit != "split" or not _raw_inline(self),
             "--refgrpo-credit split needs the reflection in a turn of its own: --self-report reflect, or "
             "inline-reflect with a chat model (raw prompts put the tag in the answer's turn)")])


@dataclass
class RLCRConfig(RLCROptions, GRPOConfig):
    """rlcr: GRPO with the Brier calibration reward (arXiv 2507.16806); the environment asks for a confidence
    (``--self-report confidence``), or the answer states it itself (``--self-report inline``, the paper's form)."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_rlcr() + [
            (self.self_report in ("confidence", "inline"), "rlcr needs --self-report confidence or inline"),
            (self.rlcr_credit != "split" or not _raw_inline(self),
             "--rlcr-credit split needs the confidence in a turn of its own: --self-report confidence, or inline with "
             "a chat model (raw prompts put the tag in the answer's turn)")])


def _raw_inline(cfg: GRPOConfig) -> bool:
    """An inline self-report on a model with raw prompts, whose tag is part of the answer's own turn (a chat model
    completes it in a turn of its own: the tag the environment opens)."""
    if cfg.self_report not in ("inline", "inline-reflect"):
        return False
    from ..errors import ConfigError, ReflectRLError
    from ..llm.models import uses_chat

    try:
        return not uses_chat(cfg.model, cfg.chat)
    except (ConfigError, ReflectRLError):  # no such model: the trainer says so when it loads it
        return False


@dataclass
class RefGRPOSeedLLMConfig(RefGRPOSeedOptions, GRPOConfig):
    """refgrpo-seed on the LLM (seed 000, section 6): a reflection predictor on the policy's hidden states,
    regressed onto the normalized per-step advantages, and the calibration bonus on its error."""

    reflection_unit: Literal["token", "turn"] = "turn"
    """The predictor's step: each agent turn (features and targets averaged over it: one bonus per turn, so the
    bonus does not grow with a completion's length), or each generated token."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_refgrpo())


@dataclass
class GearSeedLLMConfig(GearSeedOptions, GRPOConfig):
    """gear-seed on the LLM (seed 001, section 4): a distilled value head on the policy's last hidden state,
    trained on the top-K completions of each group; omega = exp((V_d - V_orig) / tau) reweights the group
    advantage token by token."""

    gear_v_orig: Literal["group_mean", "critic"] = "group_mean"
    """V_orig: the group-mean baseline broadcast over tokens, or the critic of --adv-estimator gae."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_gear() + [
            (self.gear_v_orig != "critic" or self.adv_estimator == "gae", "--gear-v-orig critic needs --adv-estimator gae")])


@dataclass
class GEARConfig(GEAROptions, GRPOConfig):
    """gear (arXiv 2605.11853): the policy with the reference answer in context is a teacher; divergence spikes
    become adaptive segments whose weights modulate the group advantage (docs/methods.md)."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_gear_paper())


GEAR_SEED_DEFAULTS: dict[str, Any] = {"group_size": 4, "gear_distill_hidden": (), "gear_distill_target": "terminal",
                                      "gamma": 1.0}


def gear_seed_llm_methods(cfg: GearSeedLLMConfig):
    """gear-seed's runner, built once the policy is loaded (V_d reads its hidden size)."""

    def build(trainer: GRPO) -> list[MethodRunner]:
        from ..contract.turns import GroupBaselineView

        method = GearSeed(trainer.policy.hidden_size, cfg.rows, cfg.group_size, cfg.gamma, cfg, method_seed(cfg.seed, 12))
        return [MethodRunner(method, view=GroupBaselineView() if cfg.gear_v_orig == "group_mean" else None)]

    return build


def gear_llm_parts(cfg: GEARConfig) -> tuple[list[Any], list[MethodRunner]]:
    """gear's teacher pass (a trainer hook) and its method runner."""
    from ..llm.teacher import TeacherPass

    return [TeacherPass(kl=cfg.gear_divergence == "kl")], [MethodRunner(GEAR(cfg))]


@dataclass
class ExGRPOConfig(ExGRPOOptions, GRPOConfig):
    """exgrpo (arXiv 2510.02245): Dr.GRPO with replay of the model's own successful trajectories of partially solved
    questions (docs/methods.md)."""

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_exgrpo_paper()
                  + [(self.policy_loss == "exgrpo", "exgrpo needs --policy-loss exgrpo (stored tokens take the shaped ratio)")])


@dataclass
class ExGRPOSeedLLMConfig(ExGRPOSeedOptions, GRPOConfig):
    """exgrpo-seed on the LLM (seed 003): a reflection memory of whole completions (their mean-pooled hidden
    states), a reflection network in [-1, 1] trained on their return ranks, and R + lambda * r_refl; or a
    language-model reflector that grades each episode (--refl-reflector lm)."""

    refl_credit: Literal["terminal", "advantage"] = "advantage"
    """Add the trajectory term to each of its tokens' advantage, after GRPO's group normalization (the LLM's
    default), or to its last token's reward, before it (terminal: in a group whose completions all scored alike
    the std normalization then makes the term a full-size advantage; BENCHMARKS.md, "Learning from experience")."""
    refl_reflector: Literal["network", "lm"] = "network"
    """Who reflects: the reflection network on mean-pooled hidden states, or a causal LM that reads each episode
    and grades it (every --refl-every updates; the updates between get no reflection term)."""
    reflector_model: str = ""
    """With --refl-reflector lm: the grading model's directory (frozen); empty: the policy itself (its current
    weights, no gradient)."""
    reflector_report: Literal["reflect", "confidence"] = "reflect"
    """With --refl-reflector lm: the question the grader answers after the episode: reflect (solved +1 / unsolved
    -1) or confidence (q in [0, 1] read as 2q - 1)."""
    reflector_max_new_tokens: int = 16
    """With --refl-reflector lm: the grader's answer budget, in tokens."""

    def budget_schedules(self) -> list[str]:
        return GRPOConfig.budget_schedules(self) + self.budget_exgrpo()

    def validate(self) -> None:
        GRPOConfig.validate(self)
        check_all(self.validate_exgrpo() + [
            (self.reflector_max_new_tokens >= 1, "--reflector-max-new-tokens must be at least 1"),
            (self.refl_reflector == "lm" or not self.reflector_model,
             "--reflector-model is the grader of --refl-reflector lm; add --refl-reflector lm or drop it")])


EXGRPO_DEFAULTS: dict[str, Any] = {"adv_estimator": "drgrpo", "loss_agg_mode": "seq-mean-token-sum-norm",
                                   "entropy_coef": 0.001, "kl_coef": 0.0, "policy_loss": "exgrpo", "group_size": 8}


def exgrpo_llm_hooks(cfg: ExGRPOConfig) -> list[Any]:
    return [ExGRPO(cfg, method_seed(cfg.seed, 13))]


def exgrpo_seed_llm_parts(cfg: ExGRPOSeedLLMConfig) -> tuple[list[Any], Any]:
    """exgrpo-seed's hooks (the language-model reflector's grading pass, with --refl-reflector lm) and its runner,
    built once the policy is loaded (the reflection network reads its hidden size)."""
    hooks: list[Any] = []
    external = None
    if cfg.refl_reflector == "lm":
        from ..llm.judge import INFO_KEY, LMReflectorPass

        hooks.append(LMReflectorPass(cfg.reflector_report, cfg.reflector_model, cfg.reflector_max_new_tokens,
                                     cfg.refl_every))
        external = INFO_KEY

    def build(trainer: GRPO) -> list[MethodRunner]:
        return [MethodRunner(ExGRPOSeed(trainer.policy.hidden_size, cfg.rows, cfg, method_seed(cfg.seed, 14),
                                        external=external))]

    return hooks, build


REFGRPO_DEFAULTS: dict[str, Any] = {"self_report": "reflect", "clip_high": 0.28,
                                    "loss_agg_mode": "seq-mean-token-mean", "kl_coef": 0.0}
RLCR_DEFAULTS: dict[str, Any] = {"self_report": "confidence"}


def refgrpo_llm_methods(cfg: RefGRPOConfig) -> list[MethodRunner]:
    return [MethodRunner(RefGRPO(cfg))]


def rlcr_llm_methods(cfg: RLCRConfig) -> list[MethodRunner]:
    return [MethodRunner(RLCR(cfg))]


def refgrpo_seed_llm_methods(cfg: RefGRPOSeedLLMConfig):
    """The runner of refgrpo-seed, built once the policy is loaded (the predictor reads its hidden size)."""

    def build(trainer: GRPO) -> list[MethodRunner]:
        from ..contract.turns import TurnView

        method = RefGRPOSeed(trainer.policy.hidden_size, cfg, cfg.learning_rate, method_seed(cfg.seed, 11))
        return [MethodRunner(method, view=TurnView() if cfg.reflection_unit == "turn" else None)]

    return build
