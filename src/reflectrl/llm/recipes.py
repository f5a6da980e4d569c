"""The CPU-scale recipe per task: a tiny model, a supervised warm-up to a weak-but-nonzero accuracy, and the
GRPO settings that raise it in a few CPU-minutes. ``benchmarks/llm_learn.py`` runs it for one seed;
``reflectrl llm compare`` builds each seed's warmed-up model with it once and trains every method from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    train_task_options: tuple[str, ...] = ()
    """Task options of the training alone, after ``task_options`` (a reward shaping such as rag's search credit:
    the warm-up's demonstrations and the evaluations' accuracy do not depend on it)."""

    def with_options(self, options: tuple[str, ...]) -> Recipe:
        """This recipe with a user's task options (KEY=VALUE) added in every phase, after the recipe's own: a later
        key wins, so a user's option also overrides a training-only one of the same key."""
        if not options:
            return self
        key = lambda o: o.partition("=")[0].strip()  # noqa: E731
        keys = {key(o) for o in options}
        return replace(self, task_options=(*self.task_options, *options),
                       train_task_options=tuple(o for o in self.train_task_options if key(o) not in keys))

    def task_flags(self, flag: str = "--task-options", train: bool = False) -> tuple[str, ...]:
        """The task options as CLI flags: ``--task-options K=V ...`` (warm-up; with ``train``, the training's, which
        adds ``train_task_options``) or ``--set K=V`` each (eval)."""
        opts = (*self.task_options, *(self.train_task_options if train else ()))
        if not opts:
            return ()
        if flag == "--set":
            return tuple(x for o in opts for x in ("--set", o))
        return (flag, *opts)


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
        # Sampling nearer the greedy policy, DAPO's dynamic sampling (about three out of four groups have one
        # outcome) and a credit for each search that finds one of the question's facts: the try that gained the
        # most on the seed that moved least (BENCHMARKS.md, "Does GRPO learn at CPU scale?").
        train=("--prompts-per-update", "8", "--group-size", "8", "--learning-rate", "2e-4", "--minibatches", "2",
               "--temperature", "0.7", "--gen-batch", "64", "--reward-workers", "4", "--filter-zero-std",
               "--max-gen-batches", "10"),
        updates=200,
        # 1000 company clusters: too many facts for the tiny model to memorize, so it learns to read what it
        # retrieves (with the default 48 it memorizes the training entities; BENCHMARKS.md, "Does GRPO learn").
        # Reading sets in abruptly (one seed went from under 20% to 48% in 100 steps), so the warm-up checks its
        # accuracy every 25 steps to stop near its target.
        task_options=("n_companies=1000",),
        train_task_options=("search_credit=1.0",)),
}


def recipe(task: str) -> Recipe:
    """The recipe of ``task``, or ConfigError naming the tasks that have one."""
    if task not in RECIPES:
        raise ConfigError(f"no CPU recipe for task {task!r} (recipes: {', '.join(sorted(RECIPES))}); "
                          "give a warmed-up --model instead")
    return RECIPES[task]
