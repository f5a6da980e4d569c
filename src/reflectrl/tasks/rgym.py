"""``reasoning-gym``: problems from any generator of the ``reasoning-gym`` package (``pip install
'reflectrl[tasks]'``), scored by the generator's own ``score_answer`` (docs/tasks.md, "Generated problems").

``get_task("reasoning-gym", dataset="chain_sum")``: each split is generated offline from a seed of its own
(``seed``, the split), and a problem whose question another split already holds is dropped (from validation when
heldout has it, from train when either has it), so the splits are disjoint and deterministic. The answer is read
from a completion as the ``data`` task reads it (``extract``, default ``auto``: an ``<answer>`` tag, ``\\boxed{}``,
``####``, else the whole completion).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import EmptySplitError, Problem, SingleTurnEnv, check_split, register_task, stable_hash
from .checkers import check_extract, extract, format_demonstration


def _generator(name: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError("task reasoning-gym needs the reasoning-gym package: pip install 'reflectrl[tasks]' (or pip "
                          "install reasoning-gym)") from None
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except ValueError as exc:
        raise ConfigError(f"reasoning-gym dataset {name!r}: {exc} (the names: reasoning_gym.factory.DATASETS)") from None
    except TypeError as exc:
        raise ConfigError(f"reasoning-gym dataset {name!r} has no such option: {exc}") from None


@register_task("reasoning-gym")
class ReasoningGymTask:
    """Problems of a reasoning-gym generator (``dataset=NAME``), scored by its own ``score_answer``."""

    name = "reasoning-gym"
    multi_turn = False
    chat_stop_sequences: tuple[str, ...] = ()  # a chat answer may reason over lines

    def __init__(self, dataset: str | None = None, config: dict[str, Any] | None = None, n_train: int = 2000,
                 n_validation: int = 200, n_heldout: int = 200, seed: int = 0, extract: str = "auto",
                 instruction: str = "Reply with only the answer."):
        if not dataset or not isinstance(dataset, str):
            raise ConfigError("task reasoning-gym needs a generator: --set dataset=NAME (e.g. chain_sum)")
        if config is not None and not isinstance(config, dict):
            raise ConfigError(f"reasoning-gym config must be a JSON object of the generator's options, got {config!r}")
        sizes = {"train": n_train, "validation": n_validation, "heldout": n_heldout}
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sizes.values()):
            raise ConfigError(f"reasoning-gym n_train, n_validation and n_heldout must be integers >= 0, got {sizes}")
        self.dataset, self.config, self.seed = dataset, dict(config or {}), seed
        self.extract, self.instruction = check_extract(extract), str(instruction).strip()
        self._splits: dict[str, list[Problem]] = {}
        self._scorer: Any = None
        taken: set[str] = set()
        for split in ("heldout", "validation", "train"):  # later splits give way to earlier ones
            self._splits[split] = self._generate(split, sizes[split], taken)
        demos = [self.demonstration(p) for s in self._splits.values() for p in s] or [""]
        self.stop_sequences: tuple[str, ...] = () if any("\n" in d for d in demos) else ("\n",)
        self.max_new_tokens = min(1024, max(16, max(len(d) for d in demos) + 8))
        self.chat_max_new_tokens = max(64, self.max_new_tokens)

    def _generate(self, split: str, size: int, taken: set[str]) -> list[Problem]:
        if size == 0:
            return []
        seed = stable_hash(f"reasoning-gym/{self.dataset}/{self.seed}/{split}") % (2 ** 31)
        gen = _generator(self.dataset, size, seed, self.config)
        self._scorer = self._scorer or gen
        out = []
        for i, entry in enumerate(gen):
            question = str(entry["question"])
            if question in taken:
                continue
            taken.add(question)
            out.append(Problem(id=f"rg:{self.dataset}:{split}:{i}", prompt=f"{question.strip()}\nanswer: ",
                               answer=str(entry["answer"]), meta={"question": question, "entry": entry}))
        return out

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split``, in the generator's order (deterministic, and disjoint across splits)."""
        check_split(split)
        if not self._splits[split]:
            raise EmptySplitError(f"task reasoning-gym has no {split} problems: set n_{split} above 0")
        return list(self._splits[split])

    def score(self, problem: Problem, completion: str) -> float:
        """The generator's ``score_answer`` of the extracted answer, in [0, 1]; 0 without an answer or where the
        generator fails on it (junk never raises)."""
        answer = extract(completion, self.extract)
        entry = problem.meta.get("entry")
        if answer is None or not isinstance(entry, dict):
            return 0.0
        try:
            value = float(self._scorer.score_answer(answer, entry))
        except Exception:  # a generator's scorer may fail on junk; junk scores 0
            return 0.0
        return min(1.0, max(0.0, value)) if value == value else 0.0

    def demonstration(self, problem: Problem) -> str:
        """The generator's answer, in the form ``extract`` asks for."""
        return format_demonstration(problem.answer or "", self.extract)

    def chat_prompt(self, problem: Problem) -> str:
        """The generator's question, then ``instruction``."""
        question = problem.meta["question"].strip()
        sep = "\n\n" if "\n" in question else " "
        return f"{question}{sep}{self.instruction}" if self.instruction else question

    def make_env(self) -> SingleTurnEnv:
        """A one-step environment whose reward is ``score``."""
        return SingleTurnEnv(self)

