"""What a recipe is expected to reach, read from the benchmark results that measured it (``benchmarks/results``).

Each recipe names a glob of result files, one per seed (:attr:`~reflectrl.experiments.recipes.TrainRecipe.results`): those of
``benchmarks/llm_learn.py`` (the CPU recipes: ``before`` and ``after`` accuracies, ``train_args``) and of
``benchmarks/real_model.py learn`` (the real model: ``before`` and ``after`` objects, ``settings``). A file counts
only when what it records of its run's settings agrees with the recipe; where no file is present, or none agrees, the
recipe is "not measured". Nothing here is a number of its own: every figure comes from a file.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .recipes import RECIPES, TrainRecipe

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
"""The results folder of a checkout (absent from an installed package: every recipe is then "not measured")."""


@dataclass
class Measured:
    """One seed's measurement of a recipe: held-out accuracy before and after training, and its budget."""

    file: str
    seed: int | None
    before: float | None
    after: float
    after_ci: list[float] | None
    problems: int | None
    budget: str
    updates: int | None = None
    differs: list[str] = field(default_factory=list)
    """The settings the file records that differ from the recipe's (empty: the file measured the recipe)."""
    aside: list[str] = field(default_factory=list)
    """Settings of the measured run that the recipe leaves to a default (said beside the numbers)."""


def flag_values(tokens: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``--flag VALUE...`` tokens as {flag name with underscores: the values joined by spaces} (a bare flag: "true")."""
    out: dict[str, str] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--"):
            key = tok[2:].replace("-", "_")
            out[key] = "true"
        elif key is not None:
            out[key] = tok if out[key] == "true" else f"{out[key]} {tok}"
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b))
    except (TypeError, ValueError):
        return str(a) == str(b)


def _budget(seconds: Any, clock: str) -> str:
    return "budget not recorded" if seconds is None else f"{float(seconds):g} {clock}-s"


def _differences(recorded: dict[str, Any], wanted: dict[str, str]) -> list[str]:
    """``key FILE's (recipe: RECIPE's)`` for each setting both name and disagree on."""
    return [f"{k} {recorded[k]} (recipe: {wanted[k]})" for k in sorted(set(recorded) & set(wanted))
            if not _same(recorded[k], wanted[k])]


def _llm_learn(raw: dict[str, Any], recipe: TrainRecipe, name: str) -> Measured:
    """A ``benchmarks/llm_learn.py`` result: the recipe's training flags are recorded as ``train_args``."""
    r = RECIPES[recipe.task]
    differs = [] if raw.get("task") == recipe.task else [f"task {raw.get('task')} (recipe: {recipe.task})"]
    wanted = " ".join([*r.train, *r.task_flags(train=True)])
    if raw.get("train_args") != wanted:
        differs.append(f"training flags {raw.get('train_args')!r} (recipe: {wanted!r})")
    tokens = raw.get("max_new_tokens")
    aside = [f"--max-new-tokens {tokens}"] if tokens is not None and "max_new_tokens" not in flag_values(recipe.flags) \
        else []
    return Measured(name, raw.get("seed"), raw.get("before"), float(raw["after"]), raw.get("after_ci"),
                    raw.get("n_heldout"), _budget(raw.get("budget_seconds"), str(raw.get("clock", "cpu")).upper()),
                    raw.get("updates"), differs, aside)


def _real_learn(raw: dict[str, Any], recipe: TrainRecipe, name: str) -> Measured:
    """A ``benchmarks/real_model.py learn`` result: its settings, task options, algo and extra flags are recorded."""
    wanted = flag_values(recipe.flags)
    recorded: dict[str, Any] = {**raw.get("settings", {}), "algo": raw.get("train_algo", raw.get("algo")),
                                "task": raw.get("task"), "task_options": " ".join(raw.get("task_options", []))}
    if raw.get("cpu_seconds_budget") is not None:
        recorded["cpu_time_limit_s"] = raw["cpu_seconds_budget"]
    differs = _differences(recorded, {**wanted, "algo": recipe.algo, "task": recipe.task,
                                      "task_options": " ".join(recipe.task_options)})
    if raw.get("flags"):
        differs.append(f"extra flags {raw['flags']!r}")
    before, after = raw.get("before") or {}, raw["after"]
    return Measured(name, raw.get("seed"), before.get("accuracy"), float(after["accuracy"]), after.get("ci"),
                    raw.get("n"), _budget(raw.get("cpu_seconds_budget"), "CPU"), raw.get("updates"), differs)


READERS = {"llm_learn": _llm_learn, "real_learn": _real_learn}


def measurements(recipe: TrainRecipe, results: Path | None = None) -> list[Measured]:
    """The result files of ``recipe`` in ``results`` (default :data:`RESULTS`), by seed; unreadable ones left out."""
    folder = RESULTS if results is None else Path(results)
    out = []
    for path in sorted(folder.glob(recipe.results)) if folder.is_dir() else []:
        try:
            raw = json.loads(path.read_text())
            out.append(READERS[raw["benchmark"]](raw, recipe, path.name))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(out, key=lambda m: (m.seed is None, m.seed or 0, m.file))


def _one(m: Measured) -> str:
    ci = f" [{m.after_ci[0]:.3f}, {m.after_ci[1]:.3f}]" if m.after_ci else ""
    before = "" if m.before is None else f"{m.before:.3f} -> "
    return f"{before}{m.after:.3f}{ci}" + ("" if m.seed is None else f" (seed {m.seed})")


def expectation(recipe: TrainRecipe, results: Path | None = None) -> dict[str, Any]:
    """What ``recipe`` is expected to reach: ``text`` (one line, or "not measured ..."), ``measured`` (by which files,
    in what budget, with what else), the ``files`` it rests on and each seed's ``after`` accuracy (the last three
    empty when not measured)."""
    found = measurements(recipe, results)
    agree = [m for m in found if not m.differs]
    if not agree:
        why = "" if not found else (" with these settings (" + "; ".join(f"{m.file}: {', '.join(m.differs)}"
                                                                          for m in found) + ")")
        return {"text": "not measured" + why, "measured": "", "files": [], "after": []}
    problems = sorted({m.problems for m in agree if m.problems is not None})
    text = (f"held-out accuracy {', '.join(_one(m) for m in agree)}"
            + (f" on {', '.join(str(p) for p in problems)} problems" if problems else ""))
    updates = [m.updates for m in agree if m.updates is not None]
    aside = sorted({a for m in agree for a in m.aside})
    measured = (f"{', '.join(m.file for m in agree)}: {' or '.join(sorted({m.budget for m in agree}))} of training"
                + (f" ({', '.join(map(str, updates))} updates)" if updates else "")
                + "".join(f", {a}" for a in aside) + (f"; {recipe.note}" if recipe.note else ""))
    return {"text": text, "measured": measured, "files": [m.file for m in agree], "after": [m.after for m in agree]}


def describe(recipe: TrainRecipe, results: Path | None = None) -> dict[str, Any]:
    """A recipe as ``reflectrl llm recipes`` lists it: name, about, task, model, budget, expected, command, flags."""
    flags = flag_values(recipe.flags)
    if "cpu_time_limit_s" in flags:
        budget = f"{float(flags['cpu_time_limit_s']):g} CPU-s of the trainer (--cpu-time-limit-s)"
    elif "time_limit_s" in flags:
        budget = f"{float(flags['time_limit_s']):g} wall-s (--time-limit-s)"
    else:
        budget = f"{flags.get('updates', '?')} updates (--updates)"
    if recipe.model:
        model, command = recipe.model, f"reflectrl llm train --recipe {recipe.name} [--cpu-time-limit-s N] [--run-dir DIR]"
    else:
        r = RECIPES[recipe.task]
        model = (f"a tiny model (llm init-tiny {' '.join(r.tiny)}) warmed up to train accuracy {r.warmup_target:g} "
                 "(llm compare builds one per seed)")
        command = f"reflectrl llm train --recipe {recipe.name} --model WARMED_UP_DIR [--run-dir DIR]"
    options = f" ({', '.join(recipe.task_options)})" if recipe.task_options else ""
    return {"name": recipe.name, "about": recipe.about, "task": recipe.task + options, "model": model,
            "budget": budget, "expected": expectation(recipe, results), "command": command,
            "flags": shlex.join(recipe.argv())}


__all__ = ["RESULTS", "Measured", "describe", "expectation", "flag_values", "measurements"]
