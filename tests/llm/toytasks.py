"""Small tasks for the LLM front-end tests (the real ones live in reflectrl.tasks)."""

from __future__ import annotations

import random

from reflectrl.tasks.base import Problem


class AddTask:
    """Single-digit addition: prompt ``"3+4="``, answer ``"7"``; reward 1 for an exact answer."""

    name = "toy-add"
    multi_turn = False

    def __init__(self, n_train: int = 64, n_heldout: int = 16, seed: int = 0):
        rng = random.Random(seed)
        pairs = [(a, b) for a in range(10) for b in range(10)]
        rng.shuffle(pairs)
        self._splits = {"train": pairs[:n_train], "heldout": pairs[n_train:n_train + n_heldout]}

    def problems(self, split: str) -> list[Problem]:
        return [Problem(f"{split}-{a}+{b}", f"{a}+{b}=", str(a + b)) for a, b in self._splits[split]]

    def score(self, problem: Problem, completion: str) -> float:
        return float(completion.strip() == problem.answer)

    def demonstration(self, problem: Problem) -> str:
        return problem.answer

    def make_env(self):
        from reflectrl.tasks.base import SingleTurnEnv

        return SingleTurnEnv(self)


class GuessEnv:
    """Multi-turn: the agent answers; a wrong answer gets the feedback ``" no;"`` and another try."""

    def __init__(self, max_tries: int = 3):
        self.max_tries, self.problem, self.tries = max_tries, None, 0

    def reset(self, problem: Problem) -> str:
        self.problem, self.tries = problem, 0
        return problem.prompt

    def step(self, text: str):
        self.tries += 1
        ok = text.strip() == self.problem.answer
        if ok or self.tries >= self.max_tries:
            return "", float(ok), True, {"correct": ok, "try": self.tries, "opaque": object()}
        return " no;", 0.0, False, {"correct": False, "try": self.tries, "opaque": object()}


class GuessTask(AddTask):
    name = "toy-guess"
    multi_turn = True

    def make_env(self):
        return GuessEnv()
