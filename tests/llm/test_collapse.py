"""The collapse alarm of trained self-reports: when reports count as constant, that K constant updates ring it (one
warning) and varied ones do not, that it survives save -> load -> continue, that runs without self-reports log
nothing new, and that ``llm compare``'s report names the runs that raised it."""

import warnings
from pathlib import Path

import pytest
import torch

from reflectrl.algos import get_algo, resume
from reflectrl.contract.base import as_nan
from reflectrl.errors import ConfigError
from reflectrl.experiments.llm_report import collapse_line
from reflectrl.experiments.rundata import RunData
from reflectrl.llm.collapse import CollapseAlarm, reports_constant
from reflectrl.runlog import behaviour, read_metrics

from .scripted import script

KEYS = ("selfreport/constant", "selfreport/collapse")


def test_what_counts_as_constant():
    assert reports_constant({"correct": torch.ones(3)}, 0.02) is None  # no self-reports: no verdict
    assert reports_constant({"correct": torch.ones(3)}, 0.02, ("reflection",)) is True  # asked, none stated
    assert reports_constant({"reflection": as_nan([0, 0, None, 0])}, 0.02) is True  # the valid ones agree
    assert reports_constant({"reflection": as_nan([0, 1, None, 0])}, 0.02) is False
    assert reports_constant({"reflection": as_nan([None, None])}, 0.02) is True  # nothing stated: no information
    assert reports_constant({"confidence": as_nan([0.5, 0.51, 0.49, None])}, 0.02) is True  # std 0.008
    assert reports_constant({"confidence": as_nan([0.5, 0.55, 0.45])}, 0.02) is False  # std 0.041
    assert reports_constant({"confidence": as_nan([0.5, 0.55, 0.45])}, 0.05) is True  # the threshold is the spread
    assert reports_constant({"confidence": as_nan([0.3, None])}, 0.02) is True
    both = {"reflection": as_nan([1, 1]), "confidence": as_nan([0.1, 0.9])}
    assert reports_constant(both, 0.02) is False  # constant only when every kind stated is


def test_alarm_rings_after_k_constant_updates_once():
    alarm = CollapseAlarm(updates=3)
    flat, varied = {"reflection": as_nan([0, 0, 0])}, {"reflection": as_nan([0, 1, 0])}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = [alarm.observe(info, u) for u, info in enumerate([flat, flat, varied, flat, flat, flat, flat, varied,
                                                                   flat, flat, flat], 1)]
    assert [r["selfreport/constant"] for r in recs] == [1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1]
    assert [r["selfreport/collapse"] for r in recs] == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert len(caught) == 1 and "update 6" in str(caught[0].message)  # one warning, the first time it rings
    assert alarm.observe({"outcome": torch.ones(2)}, 12) == {}  # no self-reports: no metrics
    asked = CollapseAlarm(updates=1, self_report="inline")  # a run that asks: watched when none is stated
    with pytest.warns(UserWarning, match="self-report collapse at update 1: the stated confidence"):
        assert asked.observe({"outcome": torch.ones(2)}, 1) == {"selfreport/constant": 1.0,
                                                                "selfreport/collapse": 1.0}


def test_alarm_settings_are_checked(tiny_dir):
    a = get_algo("llm", "grpo")
    with pytest.raises(ConfigError, match="--collapse-alarm-updates must be >= 1"):
        a.config(model=str(tiny_dir), collapse_alarm_updates=0).validate()


def _cfg(algo, tiny_dir, tmp_path, name, updates, **kw):
    return get_algo("llm", algo).config(
        task="toy-add", model=str(tiny_dir), run_dir=str(tmp_path / name), updates=updates, prompts_per_update=2,
        group_size=4, max_new_tokens=9, learning_rate=3e-3, progress=False, tensorboard=False, save_interval=2,
        sample_interval=0, reward_workers=0, export_model=False, **kw)


def _run(algo, tiny_dir, tmp_path, name, updates, constant, **kw):
    """A scripted run; returns its records and the warnings it gave."""
    a = get_algo("llm", algo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        script(a.make(_cfg(algo, tiny_dir, tmp_path, name, updates, **kw)), constant).learn()
    return read_metrics(tmp_path / name / "metrics.jsonl"), [w for w in caught if "collapse" in str(w.message)]


@pytest.mark.parametrize("algo", ["refgrpo", "rlcr"])
def test_constant_reports_ring_and_varied_ones_do_not(tiny_dir, tmp_path, algo):
    recs, warned = _run(algo, tiny_dir, tmp_path, "flat", 4, True, collapse_alarm_updates=3)
    assert [r["selfreport/constant"] for r in recs] == [1, 1, 1, 1]
    assert [r["selfreport/collapse"] for r in recs] == [0, 0, 1, 1]
    assert len(warned) == 1 and "update 3" in str(warned[0].message)
    recs, warned = _run(algo, tiny_dir, tmp_path, "varied", 4, False, collapse_alarm_updates=3)
    assert [r["selfreport/collapse"] for r in recs] == [0, 0, 0, 0] and not warned
    assert [r["selfreport/constant"] for r in recs] == [0, 0, 0, 0]


def test_alarm_survives_resume(tiny_dir, tmp_path):
    """Constant reports, K = 3: the uninterrupted run rings at update 3; a run cut after update 2 and resumed
    rings at 3 too (its count of constant updates was in the checkpoint), and one cut after update 4, having rung
    and warned, does not warn again. (A constant bonus: the step schedule follows the budget, which a cut run's
    differs from.)"""
    kw = {"collapse_alarm_updates": 3, "refgrpo_schedule": "constant"}
    full, warned = _run("refgrpo", tiny_dir, tmp_path, "full", 6, True, **kw)
    assert [r["selfreport/collapse"] for r in full] == [0, 0, 1, 1, 1, 1] and len(warned) == 1
    for cut in (2, 4):
        name = f"cut{cut}"
        _run("refgrpo", tiny_dir, tmp_path, name, cut, True, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            script(resume(tmp_path / name, 6), constant=True).learn()
        again = [w for w in caught if "collapse" in str(w.message)]
        assert len(again) == (1 if cut == 2 else 0)
        got = read_metrics(tmp_path / name / "metrics.jsonl")
        assert [{k: r[k] for k in KEYS} for r in got] == [{k: r[k] for k in KEYS} for r in full]
        assert behaviour(got) == behaviour(full)


def test_runs_without_self_reports_log_no_alarm(tiny_dir, tmp_path):
    a = get_algo("llm", "grpo")
    a.make(_cfg("grpo", tiny_dir, tmp_path, "plain", 1)).learn()
    rec = read_metrics(tmp_path / "plain" / "metrics.jsonl")[0]
    assert not any(k.startswith("selfreport/") for k in rec)


def _rundata(method, seed, collapse):
    recs = [{"update": u, "global_step": 8 * u, **({"selfreport/collapse": float(c)} if c is not None else {})}
            for u, c in enumerate(collapse, 1)]
    return RunData(Path(f"/runs/{method}-{seed}"), method, method, "arith", seed, len(collapse), records=recs)


def test_compare_report_names_the_runs_that_raised_the_alarm():
    by = {"grpo": [_rundata("grpo", 1, [None, None])],
          "refgrpo": [_rundata("refgrpo", 2, [0, 0, 1]), _rundata("refgrpo", 1, [0, 1, 0])],
          "rlcr": [_rundata("rlcr", 1, [0, 0, 0])]}
    lines = collapse_line(by, ["grpo", "refgrpo", "rlcr"])
    assert lines[0] == ("Collapse alarm (self-reports constant for K updates in training): refgrpo seed 1 (update 2), "
                        "refgrpo seed 2 (update 3).")
    assert collapse_line({"rlcr": by["rlcr"]}, ["rlcr"])[0].endswith(": no run.")
    assert collapse_line({"grpo": by["grpo"]}, ["grpo"]) == []  # no self-reports trained: no line
