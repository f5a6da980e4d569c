"""``reflectrl llm eval`` in words: the accuracy with its interval, the self-reports' calibration and what it means.

:func:`summary_lines` is the screen an evaluation ends with (on stderr beside ``--json``'s stdout, else as the output):
the accuracy and its interval, then, where self-reports were asked for, their calibration (:func:`report_lines`) and
one sentence per kind of report saying what the numbers mean. The sentences follow the intervals where there are
some (an AUROC whose interval holds 0.5 does not tell right answers from wrong) and the figures as they are elsewhere.
"""

from __future__ import annotations

from typing import Any


def _fmt(x: Any) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def report_lines(res: dict[str, Any]) -> list[str]:
    """The self-report part of an evaluation, in words (what ``--json`` holds as fields)."""
    out = []
    if res.get("reflection_missing_rate") is not None:
        out.append(f"reflection: accuracy {_fmt(res.get('reflection_accuracy'))} (best constant "
                   f"{_fmt(res.get('best_constant'))}), underconfidence {_fmt(res.get('underconfidence'))}, "
                   f"overconfidence {_fmt(res.get('overconfidence'))}, missing {100 * res['reflection_missing_rate']:.0f}%")
    if res.get("confidence_missing_rate") is not None:
        out.append(f"confidence: mean {_fmt(res.get('mean_confidence'))}, ECE {_fmt(res.get('ece'))}, Brier "
                   f"{_fmt(res.get('brier'))}, AUROC {_fmt(res.get('auroc'))}, missing "
                   f"{100 * res['confidence_missing_rate']:.0f}%")
        out += _confidence_extras(res)
    return out


def _interval(res: dict[str, Any], name: str) -> str:
    """Metric ``name``'s interval ``[low, high]``, or why there is none."""
    ci = res.get(f"{name}_ci")
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"none, {res.get(f'{name}_no_ci') or 'the value is undefined'}"


def _confidence_extras(res: dict[str, Any]) -> list[str]:
    """The intervals of a confidence's AUROC and ECE and its selective accuracies, in words (empty without them)."""
    out = []
    if "auroc_ci" in res:
        out.append(f"confidence {100 * res.get('ci_level', 0.95):g}% intervals: AUROC (DeLong) {_interval(res, 'auroc')}; "
                   f"ECE (bootstrap over problems) {_interval(res, 'ece')}")
    kept = [(float(k.split("@")[1]), v) for k, v in res.items() if k.startswith("selective_accuracy@")]
    if kept:
        out.append("selective accuracy (the most confident answers kept; a missing confidence abstains): " +
                   ", ".join(f"{_fmt(v)} at {100 * c:g}%" + (" coverage" if not i else "") for i, (c, v) in enumerate(kept)))
    return out


def report_warnings(res: dict[str, Any]) -> list[str]:
    """A warning per kind of self-report that most episodes did not state (its metrics are of the rest)."""
    out = []
    for kind, key in (("reflections", "reflection_missing_rate"), ("confidences", "confidence_missing_rate")):
        rate = res.get(key)
        if rate is not None and rate > 0.5:
            out.append(f"{100 * rate:.0f}% of the {kind} asked for are missing or malformed: their calibration is "
                       "computed on the rest")
    return out


def accuracy_line(res: dict[str, Any], what: str) -> str:
    """``WHAT on TASK/SPLIT: accuracy A [LO, HI] (greedy, n=N, 95% Wilson interval)``, pass@k where sampled."""
    lo, hi = res["ci"]
    level = f"{100 * res.get('ci_level', 0.95):g}%"
    kind = "Wilson interval" if res.get("mode") == "greedy" else "bootstrap interval over problems"
    extra = "".join(f", {k} {v:.3f}" for k, v in res.items() if k.startswith("pass@") and not k.endswith("_ci"))
    return (f"{what} on {res['task']}/{res['split']}: accuracy {res['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"({res['mode']}, n={res['n']}, {level} {kind}){extra}")


def confidence_meaning(res: dict[str, Any]) -> str:
    """One sentence on what a stated confidence's calibration means: whether it tells right answers from wrong
    (AUROC, by its interval where it has one), how its level compares with the accuracy, and what is missing."""
    auroc, ci = res.get("auroc"), res.get("auroc_ci")
    if auroc is None:
        parts = ["no AUROC: it needs stated confidences on both right and wrong answers, so whether the confidence "
                 "tells them apart is not known"]
    elif ci:
        if ci[0] > 0.5:
            verdict = f"tells right answers from wrong better than chance (AUROC {auroc:.2f}, its interval above 0.5)"
        elif ci[1] < 0.5:
            verdict = f"is higher on wrong answers than on right ones (AUROC {auroc:.2f}, its interval below 0.5)"
        else:
            verdict = (f"does not tell right answers from wrong (AUROC {auroc:.2f}, its interval holds 0.5, which is "
                       "chance)")
        parts = [f"the confidence {verdict}"]
    else:
        parts = [f"AUROC {auroc:.2f}, without an interval: 0.5 means the confidence does not tell right answers from "
                 "wrong, 1 that every right answer is stated more confident than every wrong one"]
    mean, acc = res.get("mean_confidence"), res.get("accuracy")
    if mean is not None and acc is not None:
        gap = round(100 * (mean - acc))
        level = ("matches it on average" if gap == 0 else
                 f"{'over' if gap > 0 else 'under'}confident by {abs(gap)} points on average")
        parts.append(f"it states {mean:.2f} on average against an accuracy of {acc:.2f}: {level}")
    if res.get("ece") is not None:
        parts.append(f"ECE {res['ece']:.2f} is the mean gap between the stated confidence and the accuracy at that "
                     "confidence (0: calibrated)")
    missing = res.get("confidence_missing_rate") or 0.0
    if missing >= 1:
        parts.append("none of the confidences asked for was stated in a form that parses")
    elif missing > 0:
        parts.append(f"{100 * missing:.0f}% of the confidences asked for are missing or malformed, and the figures "
                     "are of the rest")
    return "in words: " + "; ".join(parts) + "."


def reflection_meaning(res: dict[str, Any]) -> str:
    """One sentence on what the reflections' accuracy means against always giving the more common verdict."""
    ra, best = res.get("reflection_accuracy"), res.get("best_constant")
    if ra is None:
        return ("in words: no reflection could be scored (none parsed, or no answers to judge), so whether the model "
                "knows when it is right is not known.")
    than = "" if best is None else (f", {'better than' if ra > best else 'no better than'} always giving the more "
                                    f"common verdict ({100 * best:.0f}%)")
    missing = res.get("reflection_missing_rate") or 0.0
    tail = f"; {100 * missing:.0f}% are missing or malformed" if missing > 0 else ""
    return f"in words: the reflections say rightly whether the answer was solved {100 * ra:.0f}% of the time{than}{tail}."


def summary_lines(res: dict[str, Any], what: str) -> list[str]:
    """The screen ``llm eval`` ends with: the accuracy line, then the self-reports' lines and their meaning."""
    lines = [accuracy_line(res, what)]
    if res.get("reflection_missing_rate") is not None:
        lines += [f"  {line}" for line in report_lines({k: v for k, v in res.items() if k != "confidence_missing_rate"})]
        lines.append(f"  {reflection_meaning(res)}")
    if res.get("confidence_missing_rate") is not None:
        lines += [f"  {line}" for line in report_lines({k: v for k, v in res.items() if k != "reflection_missing_rate"})]
        lines.append(f"  {confidence_meaning(res)}")
    return lines


__all__ = ["accuracy_line", "confidence_meaning", "reflection_meaning", "report_lines", "report_warnings",
           "summary_lines"]
