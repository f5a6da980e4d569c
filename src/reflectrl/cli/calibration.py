"""``reflectrl calibration FILE.jsonl``: the calibration of self-reports from any trainer's or evaluation's rows.

One JSON object per line, with a correctness and a reflection and/or a confidence:

- correctness: ``correct`` (true/false or 1/0), else ``acc`` (verl's reward fields: 1.0 / 0.0);
- ``reflection``: 1 (solved) / 0 (unsolved); ``confidence``: a number in [0, 1]; null or -1 (verl's "missing")
  when the report was asked for but not stated. A row of ``reflectrl llm eval --transcripts`` carries them in its
  last ``infos`` entry, with ``self_report`` saying which was asked.

A report counts as asked on a row that has its field (or whose ``self_report`` names it): a missing one counts in
its missing rate. The metrics are :func:`reflectrl.eval.calibration.self_report_metrics`, with percentile bootstrap
intervals over rows; ``--out DIR`` also writes the reliability diagram and the risk-coverage curve of the confidences.
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
    refl = _report(src, "reflection", asked == "reflect", lambda v: v in (0.0, 1.0))
    conf = _report(src, "confidence", asked == "confidence", lambda v: 0.0 <= v <= 1.0)
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


def _report(src: dict[str, Any], key: str, asked: bool, ok: Callable[[float], bool]) -> float | None:
    """One report of a row: None when not asked (nor given), NaN when asked and not stated, else its value."""
    if key not in src and not asked:
        return None
    raw = src.get(key)
    v = None if raw is None else _number(raw)
    if raw is None or v == -1.0:
        return math.nan  # asked, not stated
    if v is None or not ok(v):
        raise ValueError(f"{key} out of range: {raw!r}")
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


def calibration_table(rows: list[tuple[float, float | None, float | None]], reps: int = 1000,
                      seed: int = 0) -> dict[str, Any]:
    """The metrics of the rows: reflection metrics over the rows where a reflection was asked, confidence metrics
    over those where a confidence was, with 95% percentile bootstrap intervals (rows resampled)."""
    from ..eval.calibration import self_report_metrics

    y = np.array([r[0] for r in rows])
    out: dict[str, Any] = {"rows": len(rows), "accuracy": float(y.mean())}
    rng = np.random.default_rng(seed)
    for idx, key in ((1, "reflection"), (2, "confidence")):
        keep = [i for i, r in enumerate(rows) if r[idx] is not None]
        if not keep:
            continue
        yy = y[keep]
        vv = np.array([rows[i][idx] for i in keep], float)
        metrics = self_report_metrics(yy, vv if key == "reflection" else None, vv if key == "confidence" else None)
        metrics.pop("accuracy", None)
        boots = [self_report_metrics(yy[s], *((vv[s], None) if key == "reflection" else (None, vv[s])))
                 for s in (rng.integers(0, len(keep), len(keep)) for _ in range(reps))]
        for name, value in metrics.items():
            samples = np.array([b.get(name, math.nan) for b in boots], float)
            samples = samples[np.isfinite(samples)]
            ci = [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))] if samples.size else None
            out[name] = {"value": None if not math.isfinite(value) else float(value), "ci": ci, "n": len(keep)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="reflectrl calibration", description="Calibration of self-reports (reflections, "
                                 "confidences) from JSON-lines rows of any trainer or evaluation: metrics with bootstrap "
                                 "intervals, a reliability diagram and a risk-coverage curve.")
    ap.add_argument("file", type=Path, help="a .jsonl file: correct (or acc) and reflection and/or confidence per row")
    ap.add_argument("--out", type=Path, default=None, help="folder for reliability.png and risk_coverage.png")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--skip-bad", action="store_true", help="leave bad rows out (one warning line each)")
    ap.add_argument("--reps", type=int, default=1000, help="bootstrap resamples (default 1000)")
    a = ap.parse_args(argv)
    if a.reps < 1:
        raise ConfigError(f"--reps must be >= 1, got {a.reps}")
    if a.out is not None:
        from ..runlog import ensure_writable_dir

        ensure_writable_dir(a.out, "--out")
    rows, bad = read_rows(a.file, a.skip_bad)
    for line in bad:
        print(f"warning: {a.file}: {line} (left out)", file=sys.stderr)
    table = calibration_table(rows, a.reps)
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
    print(f"{a.file}: {table['rows']} rows, accuracy {table['accuracy']:.3f}")
    for name, cell in table.items():
        if isinstance(cell, dict):
            ci = f" [{cell['ci'][0]:.3f}, {cell['ci'][1]:.3f}]" if cell["ci"] else ""
            value = "n/a" if cell["value"] is None else f"{cell['value']:.3f}"
            print(f"  {name:<24} {value}{ci}  (n={cell['n']})")
    for path in table.get("figures", []):
        print(f"  wrote {path}")
    return 0
