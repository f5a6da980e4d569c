"""Recipes: settings of ``reflectrl llm train`` that are known to learn, with the benchmark that measured them.

The CPU-scale recipe per task (:data:`RECIPES`): a tiny model, a supervised warm-up to a weak-but-nonzero accuracy,
and the GRPO settings that raise it in a few CPU-minutes. ``benchmarks/llm_learn.py`` runs it for one seed;
``reflectrl llm compare`` builds each seed's warmed-up model with it once and trains every method from it.

The recipes of a real pretrained model (:data:`REAL_RECIPES`): the training alone, from the model as it ships.

Every recipe is a ``reflectrl llm train --recipe NAME`` (:func:`train_recipe`): its flags fill the defaults that
explicit flags override. ``reflectrl llm recipes`` lists them with what each reached where a benchmark result in
``benchmarks/results`` measured it (:mod:`reflectrl.experiments.recipe_results`).
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


@dataclass(frozen=True)
class TrainRecipe:
    """The flags of ``reflectrl llm train --recipe NAME``, and where the benchmark results that measured them are."""

    name: str
    task: str
    model: str
    """A named model or folder; empty: the user gives one (a tiny recipe's warmed-up model)."""
    algo: str
    flags: tuple[str, ...]
    """Flags of ``llm train`` besides ``--algo``, ``--task``, ``--model`` and the task options."""
    task_options: tuple[str, ...]
    about: str
    results: str
    """A glob of ``benchmarks/results`` matching the files that measured the recipe (one per seed)."""
    note: str = ""
    """What the listing adds to the measured numbers (how the measured runs differ from the recipe)."""

    def argv(self) -> list[str]:
        """The recipe as ``llm train`` flags, task options as ``--set KEY=VALUE``."""
        model = ["--model", self.model] if self.model else []
        return ["--algo", self.algo, "--task", self.task, *model, *self.flags,
                *(x for o in self.task_options for x in ("--set", o))]


REAL_RECIPES: dict[str, TrainRecipe] = {
    # benchmarks/real_model.py learn: LEARN_FLAGS and LEARN_TASK, less what only a benchmark needs (no progress, no
    # evaluation inside the run); the CPU hour is the stop (--updates only bounds it)
    "real-arith": TrainRecipe(
        name="real-arith", task="arith", model="smollm2-135m-instruct", algo="grpo",
        flags=("--lora-r", "16", "--prompts-per-update", "8", "--grad-accum", "4", "--threads", "1",
               "--attention", "shared-prompt", "--cpu-time-limit-s", "3600", "--updates", "100000",
               "--sample-interval", "25"),
        task_options=("ops=+",),
        about="GRPO with LoRA (rank 16) on SmolLM2-135M-Instruct through its chat template: two-digit sums, 8 "
              "prompts x 8 samples per update, one CPU-hour at one thread",
        results="real_learn_grpo_s*.json",
        note="the measured runs used the padded layout; --attention shared-prompt gives the same log-probs up to "
             "float rounding in less time"),
}


def tiny_train_recipe(task: str) -> TrainRecipe:
    """The training phase of ``task``'s CPU recipe, as ``llm compare`` runs it (its update budget included)."""
    r = recipe(task)
    return TrainRecipe(
        name=task, task=task, model="", algo="grpo", flags=(*r.train, "--updates", str(r.updates)),
        task_options=(*r.task_options, *r.train_task_options),
        about=f"GRPO on a tiny model warmed up to train accuracy {r.warmup_target:g} on {task} (the CPU recipe of "
              "llm compare)",
        results=f"llm_learn_{task}_s*.json")


def recipe_names() -> list[str]:
    """Every recipe of ``llm train --recipe``: the real model's, then the CPU recipes."""
    return [*REAL_RECIPES, *RECIPES]


def train_recipe(name: str) -> TrainRecipe:
    """The recipe ``name`` of ``llm train --recipe``, or ConfigError naming the recipes."""
    if name in REAL_RECIPES:
        return REAL_RECIPES[name]
    if name in RECIPES:
        return tiny_train_recipe(name)
    raise ConfigError(f"no recipe {name!r}; recipes: {', '.join(recipe_names())} (`reflectrl llm recipes` lists them)")
