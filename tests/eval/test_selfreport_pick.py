"""benchmarks/selfreport_probe.py --pick: the rule that chooses a variant on validation problems, on hand-made claims."""

from .helpers import benchmark_script


def _claims(acc: float, au: float) -> dict:
    return {"validation_accuracy": {"effect": acc}, "stated_auroc": {"effect": au}}


def test_pick_takes_the_best_auroc_within_the_slack_else_the_best_accuracy():
    mod = benchmark_script("selfreport_probe")
    choices = {"grpo:w1": _claims(-0.04, 0.30), "grpo:w0.5": _claims(-0.008, 0.20), "grpo:w0.25": _claims(0.0, 0.10)}
    # w1 has the best AUROC but loses 4 points; w0.5 is within the 1-point slack and beats w0.25's AUROC
    assert mod.pick(choices) == {"grpo": "w0.5"}
    choices["grpo:w0.5"] = _claims(-0.011, 0.20)  # just outside the slack: w0.25 is the only one left
    assert mod.pick(choices) == {"grpo": "w0.25"}
    worse = {"grpo:a": _claims(-0.05, 0.3), "grpo:b": _claims(-0.03, 0.1)}  # none within: the best accuracy
    assert mod.pick(worse) == {"grpo": "b"}
    assert mod.pick({"x:a": _claims(0.0, 0.1), "y:b": _claims(-0.5, 0.0)}) == {"x": "a", "y": "b"}
