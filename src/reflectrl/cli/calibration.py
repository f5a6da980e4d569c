"""``reflectrl calibration FILE.jsonl``: the calibration of self-reports from any trainer's or evaluation's rows.

One JSON object per line, with a correctness and a reflection and/or a confidence:

- correctness: ``correct`` (true/false or 1/0), else ``acc`` (verl's reward fields: 1.0 / 0.0);
- ``reflection``: 1 (solved) / 0 (unsolved); ``confidence``: a number in [0, 1]; null or -1 (verl's "missing")
  when the report was asked for but not stated (so is a bare ``NaN``, which files written before reflectrl wrote
  strict JSON hold). A row of ``reflectrl llm eval --transcripts`` carries them in its last ``infos`` entry, with
  ``self_report`` saying which was asked.

A report counts as asked on a row that has its field (or whose ``self_report`` names it): a missing one counts in
its missing rate. The metrics are :func:`reflectrl.eval.calibration.self_report_metrics` and, for confidences, the
selective accuracies (:func:`reflectrl.eval.calibration.selective_accuracies`), with percentile bootstrap intervals
over rows (AUROC also with DeLong's); ``--out DIR`` also writes the reliability diagram and the risk-coverage curve
of the confidences. Each metric comes with the rows it is computed from (``n``, and what they are: a missing rate and
a selective accuracy are over the rows that were asked, every other metric over the rows that stated the report), and
an interval only where those rows are enough (:data:`~reflectrl.eval.uncertainty.MIN_INTERVAL_ROWS`,
:data:`~reflectrl.eval.uncertainty.MIN_AUROC_CLASS_ROWS`). ``--validation FILE`` with ``--target-coverage`` or
``--target-accuracy`` picks an abstention threshold on FILE's rows and applies it to these
(:func:`reflectrl.eval.calibration.transfer_threshold`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..eval.uncertainty import MIN_AUROC_CLASS_ROWS as MIN_AUROC_CLASS_ROWS  # one definition, kept importable here
from ..eval.uncertainty import MIN_INTERVAL_ROWS as MIN_INTERVAL_ROWS
from ..eval.uncertainty import interval_refusal

Row = tuple[float, float | None, float | None]
"""A row: correctness, reflection, confidence (a report not asked None, one asked but not stated NaN)."""

_REPORTS = (("reflection", "a reflection"), ("confidence", "a confidence"))


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def parse_row(obj: Any) -> tuple[float, float | None, float | None]:
    """``(correct, reflection, confidence)`` of one row: a report not asked is None, one asked but missing NaN;
    ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    last = obj["infos"][-1] if isinstance(obj.get("infos"), list) and obj["infos"] and \
        isinstance(obj["infos"][-1], dict) else {}
    src = {**last, **{k: v for k, v in obj.items() if k in ("correct", "acc", "reflection", "confidence", "self_report")}}
    y = _correctness(src)
    asked = src.get("self_report")
    refl = _report(src, "reflection", asked == "reflect", lambda v: v in (0.0, 1.0), "be 1 (solved) or 0 (unsolved)")
    conf = _report(src, "confidence", asked == "confidence", lambda v: 0.0 <= v <= 1.0, "lie in [0, 1]")
    if refl is None and conf is None:
        raise ValueError("neither a reflection nor a confidence (nor a self_report naming one)")
    return y, refl, conf


def _correctness(src: dict[str, Any]) -> float:
    """A row's correctness, 1.0 or 0.0, from ``correct`` (true/false, 1/0) or ``acc`` (1.0/0.0)."""
    for key, form in (("correct", "true/false or 1/0"), ("acc", "1.0 or 0.0")):
        if key in src:
            y = _number(src[key])
            if y is None or y not in (0.0, 1.0):
                raise ValueError(f"{key} must be {form}, got {src[key]!r}")
            return y
    raise ValueError("no correctness: give correct (true/false) or acc (1/0)")


def _report(src: dict[str, Any], key: str, asked: bool, ok: Callable[[float], bool], form: str) -> float | None:
    """One report of a row: None when not asked (nor given), NaN when asked and not stated (null, -1 or a bare NaN),
    else its value; ValueError for a value that is not a number (``form`` says which numbers are allowed)."""
    if key not in src and not asked:
        return None
    raw = src.get(key)
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return math.nan  # asked, not stated (null; a bare NaN in files written before strict JSON)
    if not isinstance(raw, (bool, int, float)):
        raise ValueError(f"{key} must be a number, got {raw!r}")
    v = float(raw)
    if v == -1.0:
        return math.nan  # verl's "not stated"
    if not (math.isfinite(v) and ok(v)):
        raise ValueError(f"{key} must {form}, got {raw!r}")
    return v


def read_rows(path: Path, skip_bad: bool = False) -> tuple[list[tuple[float, float | None, float | None]], list[str]]:
    """The rows of a JSONL file and one message per bad line (``line N: ...``); ConfigError listing them unless
    ``skip_bad``."""
    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    rows, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(parse_row(json.loads(line)))
            except (ValueError, json.JSONDecodeError) as exc:
                bad.append(f"line {n}: {exc}")
    if bad and not skip_bad:
        more = f" (and {len(bad) - 20} more)" if len(bad) > 20 else ""
        raise ConfigError(f"{path}: {len(bad)} bad rows{more}:\n  " + "\n  ".join(bad[:20]) +
                          "\n  (--skip-bad leaves them out, with a warning each)")
    if not rows:
        raise ConfigError(f"{path} holds no usable row")
    return rows, bad


def _rows_used(name: str, noun: str, v: np.ndarray) -> tuple[int, str]:
    """How many of the rows asked for a report (its values ``v``, NaN where not stated) metric ``name`` is computed
    from, and which rows they are."""
    if name.endswith("_missing_rate"):
        return v.size, f"rows asked for {noun}"
    if name.startswith("selective_accuracy@"):
        return v.size, f"rows asked for {noun}, a missing one abstaining"
    if name == "underconfidence":
        return int(np.sum(v == 0.0)), "rows that stated unsolved"
    if name in ("overconfidence", "selective_accuracy"):
        return int(np.sum(v == 1.0)), "rows that stated solved"
    return int(np.sum(~np.isnan(v))), f"rows that stated {noun}"


def _interval_refused(name: str, n: int, y: np.ndarray, v: np.ndarray) -> str | None:
    """Why metric ``name`` gets no interval from its ``n`` rows (outcomes ``y``, reports ``v``), or None
    (:func:`reflectrl.eval.uncertainty.interval_refusal`)."""
    if name != "auroc":
        return interval_refusal(n)
    right = int(y[~np.isnan(v)].sum())
    return interval_refusal(n, classes=(right, n - right))


def _metrics(key: str, y: np.ndarray, v: np.ndarray) -> dict[str, float]:
    """The metrics of report ``key`` (values ``v``, NaN where not stated) over rows with outcomes ``y``: a
    confidence's also with its selective accuracies."""
    from ..eval.calibration import selective_accuracies, self_report_metrics

    if key == "reflection":
        return self_report_metrics(y, v, None)
    return {**self_report_metrics(y, None, v), **selective_accuracies(v, y)}


def calibration_table(rows: list[tuple[float, float | None, float | None]], reps: int = 1000,
                      seed: int = 0) -> dict[str, Any]:
    """The metrics of the rows: reflection metrics over the rows where a reflection was asked, confidence metrics
    (with the selective accuracies) over those where a confidence was, with 95% percentile bootstrap intervals (rows
    resampled).

    ``accuracy`` is over every row; ``reports`` gives per report the rows ``asked``, ``stated`` and ``missing`` and
    the ``accuracy`` of the stated ones. Each metric is ``{"value", "ci", "n", "over", "report"}``: ``n`` rows, the
    ones ``over`` names, went into it; ``ci`` is None where no interval is given, with ``no_ci`` saying why when those
    rows are too few (:data:`MIN_INTERVAL_ROWS`, :data:`MIN_AUROC_CLASS_ROWS`). ``auroc`` also has ``ci_delong``, its
    95% DeLong interval (:func:`reflectrl.eval.uncertainty.auroc_interval`), refused by the same rule."""
    from ..eval.uncertainty import auroc_interval

    y = np.array([r[0] for r in rows])
    out: dict[str, Any] = {"rows": len(rows), "accuracy": float(y.mean()), "reports": {}}
    rng = np.random.default_rng(seed)
    for idx, (key, noun) in enumerate(_REPORTS, 1):
        keep = [i for i, r in enumerate(rows) if r[idx] is not None]
        if not keep:
            continue
        yy = y[keep]
        vv = np.array([rows[i][idx] for i in keep], float)
        stated = ~np.isnan(vv)
        out["reports"][key] = {"asked": len(keep), "stated": int(stated.sum()), "missing": int((~stated).sum()),
                               "accuracy": float(yy[stated].mean()) if stated.any() else None}
        metrics = _metrics(key, yy, vv)
        metrics.pop("accuracy", None)
        boots = [_metrics(key, yy[s], vv[s]) for s in (rng.integers(0, len(keep), len(keep)) for _ in range(reps))] \
            if len(keep) >= MIN_INTERVAL_ROWS else []
        for name, value in metrics.items():
            n, over = _rows_used(name, noun, vv)
            cell: dict[str, Any] = {"value": None if not math.isfinite(value) else float(value), "ci": None, "n": n,
                                    "over": over, "report": key}
            refused = _interval_refused(name, n, yy, vv)
            if refused:
                cell["no_ci"] = refused
            elif cell["value"] is not None:  # no interval around an undefined value
                samples = np.array([b.get(name, math.nan) for b in boots], float)
                samples = samples[np.isfinite(samples)]
                if samples.size:
                    cell["ci"] = [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))]
            if name == "auroc":  # beside the bootstrap's: DeLong's, refused by the same rule
                delong = auroc_interval(vv, yy).ci
                cell["ci_delong"] = None if delong is None else [delong[0], delong[1]]
            out[name] = cell
    return out


def format_table(table: dict[str, Any], name: str) -> list[str]:
    """The lines ``reflectrl calibration`` prints for a :func:`calibration_table` of file ``name``: the accuracy over
    every row, then per report the rows asked, stated and missing, and each metric with its interval (or why there
    is none) and the rows it is over; a metric no row went into is left out."""
    rows = table["rows"]
    lines = [f"{name}: {rows} rows; accuracy {table['accuracy']:.3f} over all {rows} rows"]
    for key, rep in table["reports"].items():
        acc = "" if rep["accuracy"] is None else f" (their accuracy {rep['accuracy']:.3f})"
        lines.append(f"  {key}: asked on {rep['asked']} rows, stated on {rep['stated']}{acc}, missing on "
                     f"{rep['missing']}")
        for metric, cell in table.items():
            if not (isinstance(cell, dict) and cell.get("report") == key) or (cell["value"] is None and not cell["n"]):
                continue
            value = "n/a" if cell["value"] is None else f"{cell['value']:.3f}"
            ci = "" if cell["value"] is None else (f" [{cell['ci'][0]:.3f}, {cell['ci'][1]:.3f}]" if cell["ci"] else
                                                   f" ({cell['no_ci']})" if cell.get("no_ci") else "")
            if cell["value"] is not None and cell.get("ci_delong"):
                ci += f"{',' if ci else ''} DeLong [{cell['ci_delong'][0]:.3f}, {cell['ci_delong'][1]:.3f}]"
            lines.append(f"    {metric:<24} {value}{ci}  (n={cell['n']}: {cell['over']})")
    if "abstention" in table:
        lines += abstention_lines(table["abstention"])
    return lines


def _confidences(rows: list[Row]) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) of the rows asked for a confidence; NaN where none was stated."""
    asked = [(r[2], r[0]) for r in rows if r[2] is not None]
    return np.array([q for q, _ in asked], float), np.array([y for _, y in asked], float)


def abstention(rows: list[Row], validation: list[Row], coverage: float | None = None, accuracy: float | None = None
               ) -> dict[str, Any]:
    """The abstention threshold picked on the ``validation`` rows for a target ``coverage`` or ``accuracy`` and what
    it gives on ``rows`` (:func:`reflectrl.eval.calibration.transfer_threshold`, over the rows asked for a
    confidence, a missing one abstaining), with ``target``; ConfigError when the target is out of reach."""
    from ..eval.calibration import transfer_threshold

    (vq, vy), (q, y) = _confidences(validation), _confidences(rows)
    for what, qq in (("--validation file", vq), ("file", q)):
        if not qq.size:
            raise ConfigError(f"the {what} has no row asked for a confidence: no abstention threshold")
    try:
        out = transfer_threshold(vq, vy, q, y, coverage=coverage, accuracy=accuracy)
    except ValueError as exc:
        raise ConfigError(f"--validation: {exc}") from None
    target = {"coverage": coverage} if coverage is not None else {"accuracy": accuracy}
    return {"target": target, **{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()},
            "validation": {k: (None if math.isnan(v) else v) for k, v in out["validation"].items()}}


def abstention_lines(res: dict[str, Any]) -> list[str]:
    """:func:`abstention` in words: the threshold, what it gives on the validation rows, and on these."""
    def gives(r: dict[str, Any]) -> str:
        acc = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        return f"answers {int(r['answered'])} of {int(r['rows'])} rows (coverage {r['coverage']:.3f}), accuracy {acc}"

    (goal, value), = res["target"].items()
    return [f"  abstention: answer when confidence >= {res['threshold']:.3f}, picked on the validation rows for "
            f"{goal} >= {value:g}",
            f"    on the validation rows it {gives(res['validation'])}", f"    on these rows it {gives(res)}"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reflectrl calibration", description="Calibration of self-reports (reflections, "
                                 "confidences) from JSON-lines rows of any trainer or evaluation: metrics with bootstrap "
                                 "intervals, a reliability diagram and a risk-coverage curve.")
    ap.add_argument("file", type=Path, help="a .jsonl file: correct (or acc) and reflection and/or confidence per row")
    ap.add_argument("--out", type=Path, default=None, help="folder for reliability.png and risk_coverage.png")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--skip-bad", action="store_true", help="leave bad rows out (one warning line each)")
    ap.add_argument("--reps", type=int, default=1000, help="bootstrap resamples (default 1000)")
    ap.add_argument("--validation", type=Path, default=None, metavar="FILE",
                    help="rows of validation problems (e.g. `reflectrl llm eval --split validation --transcripts "
                         "FILE`): pick the abstention threshold on them (answer when confidence >= it, abstain "
                         "otherwise and where none is stated) and apply it to FILE's rows; needs a target")
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--target-coverage", type=float, default=None, metavar="C",
                        help="with --validation: the highest threshold answering at least this share of the "
                             "validation rows")
    target.add_argument("--target-accuracy", type=float, default=None, metavar="A",
                        help="with --validation: the lowest threshold whose answered validation rows are at least "
                             "this accurate")
    return ap


def _check_args(a: argparse.Namespace) -> None:
    """One clear error for settings that cannot go together, before any file is read."""
    if a.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {a.reps}")
    has_target = a.target_coverage is not None or a.target_accuracy is not None
    if a.validation is None and has_target:
        raise ConfigError("--target-coverage and --target-accuracy pick a threshold on --validation FILE's rows: give it")
    if a.validation is not None and not has_target:
        raise ConfigError("--validation needs a target: --target-coverage C or --target-accuracy A")
    for flag, v in (("--target-coverage", a.target_coverage), ("--target-accuracy", a.target_accuracy)):
        if v is not None and not 0 < v <= 1:
            raise ConfigError(f"{flag} must lie in (0, 1], got {v}")
    if a.out is not None:
        from ..runlog import ensure_writable_dir

        ensure_writable_dir(a.out, "--out")


def _read(path: Path, skip_bad: bool) -> list[Row]:
    """:func:`read_rows` of ``path``, with a warning line per bad row left out."""
    rows, bad = read_rows(path, skip_bad)
    for line in bad:
        print(f"warning: {path}: {line} (left out)", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    _check_args(a)
    rows = _read(a.file, a.skip_bad)
    table = calibration_table(rows, a.reps)
    if a.validation is not None:
        table["abstention"] = {"validation_file": str(a.validation),
                               **abstention(rows, _read(a.validation, a.skip_bad), a.target_coverage,
                                            a.target_accuracy)}
    if a.out is not None:
        from ..eval.calibration import reliability_diagram, risk_coverage_curve

        conf = [(r[2], r[0]) for r in rows if r[2] is not None and not math.isnan(r[2])]
        if conf:
            q, y = [c for c, _ in conf], [v for _, v in conf]
            table["figures"] = [str(reliability_diagram(q, y, a.out / "reliability.png")),
                                str(risk_coverage_curve(q, y, a.out / "risk_coverage.png"))]
    if a.json:
        print(json.dumps(table))
        return 0
    print("\n".join(format_table(table, str(a.file))))
    for path in table.get("figures", []):
        print(f"  wrote {path}")
    return 0
