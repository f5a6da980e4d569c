"""The CPU-scale recipe per task: a tiny model, a supervised warm-up to a weak-but-nonzero accuracy, and the
GRPO settings that raise it in a few CPU-minutes. ``benchmarks/llm_learn.py`` runs it for one seed;
``reflectrl llm compare`` builds each seed's warmed-up model with it once and trains every method from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Recipe:
    """Flags of ``reflectrl llm init-tiny``, ``llm warmup`` and ``llm train`` for one task."""

    tiny: tuple[str, ...]
    warmup: tuple[str, ...]
    warmup_target: float
    train: tuple[str, ...]
    updates: int
    """The default update budget of one ``reflectrl llm compare`` run (``--updates`` overrides it); BENCHMARKS.md
    gives the CPU time GRPO takes for it."""
    task_options: tuple[str, ...] = ()
    """Task options (KEY=VALUE) of the warm-up, the training and the evaluations."""

    def task_flags(self, flag: str = "--task-options") -> tuple[str, ...]:
        """``task_options`` as CLI flags: ``--task-options K=V ...`` (warm-up, train) or ``--set K=V`` each (eval)."""
        if not self.task_options:
            return ()
        if flag == "--set":
            return tuple(x for o in self.task_options for x in ("--set", o))
        return (flag, *self.task_options)


RECIPES: dict[str, Recipe] = {
    "arith": Recipe(
        tiny=("--layers", "2", "--width", "64", "--heads", "4"),
        warmup=("--steps", "5000", "--batch-size", "64", "--learning-rate", "3e-3", "--eval-every", "100",
                "--eval-problems", "256"),
        warmup_target=0.2,
        train=("--prompts-per-update", "32", "--group-size", "8", "--learning-rate", "2e-4", "--minibatches", "4",
               "--temperature", "1.0", "--gen-batch", "128"),
        updates=1200),
    "codegen": Recipe(
        tiny=("--layers", "2", "--width", "64", "--heads", "4"),
        warmup=("--steps", "5000", "--batch-size", "32", "--learning-rate", "3e-3", "--eval-every", "25",
                "--eval-problems", "128"),
        warmup_target=0.2,
        train=("--prompts-per-update", "16", "--group-size", "8", "--learning-rate", "2e-4", "--minibatches", "4",
               "--temperature", "1.0", "--gen-batch", "32", "--reward-workers", "4"),
        updates=300),
    "text2sql": Recipe(
        tiny=("--layers", "2", "--width", "64", "--heads", "4", "--max-positions", "1024"),
        warmup=("--steps", "2000", "--batch-size", "32", "--learning-rate", "3e-3", "--eval-every", "100",
                "--eval-problems", "64"),
        warmup_target=0.2,
        train=("--prompts-per-update", "8", "--group-size", "8", "--learning-rate", "2e-4", "--minibatches", "2",
               "--temperature", "1.0", "--gen-batch", "64", "--reward-workers", "4"),
        updates=150),
    "rag": Recipe(
        tiny=("--layers", "2", "--width", "64", "--heads", "4", "--max-positions", "1024"),
        warmup=("--steps", "2000", "--batch-size", "32", "--learning-rate", "3e-3", "--eval-every", "25",
                "--eval-problems", "64"),
        warmup_target=0.2,
        train=("--prompts-per-update", "8", "--group-size", "8", "--learning-rate", "2e-4", "--minibatches", "2",
               "--temperature", "1.0", "--gen-batch", "64", "--reward-workers", "4"),
        updates=200,
        # 1000 company clusters: too many facts for the tiny model to memorize, so it learns to read what it
        # retrieves (with the default 48 it memorizes the training entities; BENCHMARKS.md, "Does GRPO learn").
        # Reading sets in abruptly (one seed went from under 20% to 48% in 100 steps), so the warm-up checks its
        # accuracy every 25 steps to stop near its target.
        task_options=("n_companies=1000",)),
}


def recipe(task: str) -> Recipe:
    """The recipe of ``task``, or ConfigError naming the tasks that have one."""
    if task not in RECIPES:
        raise ConfigError(f"no CPU recipe for task {task!r} (recipes: {', '.join(sorted(RECIPES))}); "
                          "give a warmed-up --model instead")
    return RECIPES[task]
