"""reflectrl calibration FILE.jsonl: the metrics of llm eval, reproduced from its own dumped rows; bad rows in one
line each; a bare NaN (older files) read as missing; every count the rows a metric used, and no interval from too
few of them."""

import json
import math

import pytest

from reflectrl.cli import main
from reflectrl.cli.calibration import MIN_AUROC_CLASS_ROWS, MIN_INTERVAL_ROWS, calibration_table
from reflectrl.eval import uncertainty
from reflectrl.eval.calibration import selective_accuracies, transfer_threshold
from reflectrl.eval.uncertainty import auroc_interval


def test_it_reproduces_llm_eval_from_the_dumped_episodes(tmp_path, capsys):
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup

    tiny = init_tiny(tmp_path / "tiny", layers=1, width=32, heads=2, max_positions=128, seed=0)
    warmup(WarmupConfig(model=str(tiny), task="arith", task_options=("digits=1",), out=str(tmp_path / "w"), steps=200,
                        batch_size=32, learning_rate=3e-3, self_report="both", progress=False))
    dump = tmp_path / "episodes.jsonl"
    assert main(["llm", "eval", str(tmp_path / "w"), "--split", "train", "--limit", "40", "--self-report", "both",
                 "--json", "--no-progress", "--transcripts", str(dump)]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert main(["calibration", str(dump), "--json", "--reps", "50", "--out", str(tmp_path / "fig")]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["rows"] == 80 and cal["accuracy"] == pytest.approx(ev["accuracy"])
    for key in ("reflection_accuracy", "reflection_missing_rate", "underconfidence", "ece", "brier", "auroc",
                "mean_confidence", "confidence_missing_rate"):
        if ev.get(key) is None:
            assert cal.get(key) is None or cal[key]["value"] is None, key
        else:
            assert cal[key]["value"] == pytest.approx(ev[key]), key
    for c in (0.5, 0.8, 1.0):  # the selective accuracies, a missing confidence abstaining in both
        key = f"selective_accuracy@{c}"
        assert cal[key]["value"] == (None if ev[key] is None else pytest.approx(ev[key])), key
    assert cal["auroc"]["ci_delong"] == (None if ev["auroc_ci"] is None else pytest.approx(ev["auroc_ci"]))
    assert ev["ece"] is not None and ev["reflection_accuracy"] is not None  # the model states both reports
    assert (tmp_path / "fig" / "reliability.png").is_file() and (tmp_path / "fig" / "risk_coverage.png").is_file()
    # docs/calibration.md's abstention threshold: picked on one evaluation's dump (the train problems stand in for the
    # validation split, which one-digit arith lacks), applied to another's; the same as from the two --json reports
    held = tmp_path / "heldout.jsonl"
    assert main(["llm", "eval", str(tmp_path / "w"), "--split", "heldout", "--self-report",
                 "confidence", "--json", "--no-progress", "--transcripts", str(held)]) == 0
    ho = json.loads(capsys.readouterr().out)
    assert main(["calibration", str(held), "--validation", str(dump), "--target-coverage", "0.5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["abstention"]
    want = transfer_threshold(ev["reports"]["confidence"], ev["reports"]["correct"], ho["reports"]["confidence"],
                              ho["reports"]["correct"], coverage=0.5)
    assert got["threshold"] == want["threshold"] and got["rows"] == ho["n"] and got["validation"]["rows"] == 40
    assert (got["coverage"], got["accuracy"]) == pytest.approx((want["coverage"], want["accuracy"]), nan_ok=True)


def test_bad_rows_one_line_each(tmp_path, capsys):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join([json.dumps({"correct": True, "confidence": 0.9}), "not json",
                            json.dumps({"confidence": 0.5}), json.dumps({"correct": 1, "confidence": 1.5}),
                            json.dumps({"acc": 0.0, "confidence": -1.0, "reflection": 1})]) + "\n")
    assert main(["calibration", str(f)]) == 2
    err = capsys.readouterr().err
    assert "3 bad rows" in err and "line 2:" in err and "line 3: no correctness" in err
    assert "line 4: confidence must lie in [0, 1], got 1.5" in err
    assert main(["calibration", str(f), "--skip-bad", "--json", "--reps", "20"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("warning:") == 3
    res = json.loads(cap.out)
    assert res["rows"] == 2 and res["confidence_missing_rate"]["value"] == 0.5  # verl's -1: asked, not stated


def test_a_report_of_the_wrong_type_is_a_type_error(tmp_path, capsys):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in ({"correct": True, "confidence": "0.7"},
                                                    {"correct": False, "reflection": [1]})) + "\n")
    assert main(["calibration", str(f)]) == 2
    err = capsys.readouterr().err
    assert "line 1: confidence must be a number, got '0.7'" in err and "line 2: reflection must be a number, got [1]" \
        in err and "range" not in err


def test_a_bare_nan_of_an_older_file_is_a_missing_report(tmp_path, capsys):
    f = tmp_path / "old.jsonl"
    rows = [{"acc": 1.0, "reflection": math.nan, "confidence": 0.9}, {"acc": 0.0, "reflection": math.nan,
                                                                      "confidence": math.nan}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "NaN" in f.read_text()  # what json.dumps wrote before the dumps were strict JSON
    assert main(["calibration", str(f), "--json", "--reps", "20"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rows"] == 2 and res["confidence_missing_rate"]["value"] == 0.5
    assert res["reflection_missing_rate"]["value"] == 1.0 and res["reports"]["reflection"]["stated"] == 0


def test_every_count_is_the_rows_the_metric_used(tmp_path, capsys):
    """Five rows, three stated confidences and one reflection: the confidence metrics are over three, the missing
    rates over five, the missing counts are shown apart, and no interval comes from so few rows."""
    f = tmp_path / "rows.jsonl"
    rows = [(1.0, None, 0.9), (0.0, None, 0.2), (0.0, 0, None), (0.0, None, 0.1), (1.0, None, None)]
    f.write_text("".join(json.dumps({"acc": y, "reflection": r, "confidence": q}) + "\n" for y, r, q in rows))
    assert main(["calibration", str(f), "--json", "--reps", "20"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["reports"] == {"reflection": {"asked": 5, "stated": 1, "missing": 4, "accuracy": 0.0},
                              "confidence": {"asked": 5, "stated": 3, "missing": 2, "accuracy": pytest.approx(1 / 3)}}
    assert [res[k]["n"] for k in ("ece", "auroc", "mean_confidence", "confidence_missing_rate")] == [3, 3, 3, 5]
    assert res["task_accuracy"]["n"] == res["underconfidence"]["n"] == 1 and res["overconfidence"]["n"] == 0
    assert res["auroc"]["value"] == 1.0 and res["auroc"]["ci"] is None
    assert res["auroc"]["no_ci"] == f"interval needs >= {MIN_INTERVAL_ROWS} rows"
    assert main(["calibration", str(f), "--reps", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("5 rows; accuracy 0.400 over all 5 rows")
    line = {ln.split()[0]: ln for ln in out[1:]}
    assert line["confidence:"] == "  confidence: asked on 5 rows, stated on 3 (their accuracy 0.333), missing on 2"
    assert line["auroc"].split()[1:] == ["1.000", "(interval", "needs", ">=", f"{MIN_INTERVAL_ROWS}", "rows)", "(n=3:",
                                         "rows", "that", "stated", "a", "confidence)"]
    assert line["task_accuracy"].split()[1] == "0.000" and "(n=1: rows that stated a reflection)" in line["task_accuracy"]
    assert "(n=5: rows asked for a confidence)" in line["confidence_missing_rate"]
    assert "overconfidence" not in line  # no row stated "solved": nothing to print


def test_an_auroc_interval_needs_both_classes():
    """Enough rows for every other interval, but too few wrong ones for AUROC's; enough of each, and it has one."""
    few_wrong = [(1.0, None, 0.5 + 0.02 * i) for i in range(20)] + [(0.0, None, 0.3)] * (MIN_AUROC_CLASS_ROWS - 1)
    res = calibration_table(few_wrong, reps=50)
    assert res["ece"]["ci"] is not None and "no_ci" not in res["ece"]
    assert res["auroc"]["ci"] is None and res["auroc"]["value"] == 1.0
    assert res["auroc"]["no_ci"] == (f"interval needs >= {MIN_AUROC_CLASS_ROWS} right and >= {MIN_AUROC_CLASS_ROWS} "
                                     "wrong rows")
    res = calibration_table(few_wrong + [(0.0, None, 0.6)], reps=50)
    lo, hi = res["auroc"]["ci"]
    assert lo <= res["auroc"]["value"] <= hi and lo < 1.0


def test_one_definition_of_the_minimum_counts():
    assert (MIN_INTERVAL_ROWS, MIN_AUROC_CLASS_ROWS) == (uncertainty.MIN_INTERVAL_ROWS, uncertainty.MIN_AUROC_CLASS_ROWS)


def test_delong_beside_the_bootstrap_and_the_selective_accuracies(tmp_path, capsys):
    """AUROC's DeLong interval is given where the bootstrap's is, by the same rule; the selective accuracies are over
    the rows asked for a confidence (a missing one abstaining), with bootstrap intervals."""
    rows = [(1.0, None, 0.5 + 0.02 * i) for i in range(20)] + [(0.0, None, 0.3)] * MIN_AUROC_CLASS_ROWS + \
        [(0.0, None, 0.6), (1.0, None, math.nan)]
    q, y = [r[2] for r in rows], [r[0] for r in rows]
    res = calibration_table(rows, reps=200)
    assert res["auroc"]["ci_delong"] == pytest.approx(list(auroc_interval(q, y).ci))
    assert res["auroc"]["ci"] is not None and res["auroc"]["ci_delong"] != pytest.approx(res["auroc"]["ci"])
    want = selective_accuracies(q, y)
    for c in (0.5, 0.8):
        cell = res[f"selective_accuracy@{c}"]
        assert cell["value"] == pytest.approx(want[f"selective_accuracy@{c}"])
        assert cell["n"] == 27 and cell["over"] == "rows asked for a confidence, a missing one abstaining"
        assert cell["ci"][0] <= cell["value"] <= cell["ci"][1]
    assert res["selective_accuracy@1.0"]["value"] is None and res["selective_accuracy@1.0"]["ci"] is None
    refused = calibration_table(rows[:20] + rows[21:25], reps=50)  # four wrong rows: neither AUROC interval
    assert refused["auroc"]["ci"] is None and refused["auroc"]["ci_delong"] is None and refused["auroc"]["no_ci"]
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps({"acc": a, "confidence": c}) + "\n" for a, _, c in rows))
    assert main(["calibration", str(f), "--reps", "200"]) == 0
    line = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    lo, hi = res["auroc"]["ci_delong"]
    assert f", DeLong [{lo:.3f}, {hi:.3f}]  (n=26: rows that stated a confidence)" in line["auroc"]
    assert line["selective_accuracy@1.0"].split()[1:3] == ["n/a", "(n=27:"]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps({"correct": y, "confidence": q}) + "\n" for q, y in rows))
    return path


def test_an_abstention_threshold_from_validation_rows(tmp_path, capsys):
    # validation: q >= 0.8 answers 3 of 6 rows (coverage 0.5, 2 right); the row without a confidence abstains
    val = _jsonl(tmp_path / "val.jsonl", [(0.9, 1), (0.8, 0), (0.8, 1), (0.5, 1), (None, 0), (0.2, 0)])
    # held out: 0.95 (right) and 0.8 (wrong) reach 0.8, 0.79 does not: coverage 2/5, accuracy 1/2
    test = _jsonl(tmp_path / "test.jsonl", [(0.95, 1), (0.8, 0), (0.79, 1), (None, 1), (0.1, 0)])
    assert main(["calibration", str(test), "--validation", str(val), "--target-coverage", "0.5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["abstention"]
    assert got == {"validation_file": str(val), "target": {"coverage": 0.5}, "threshold": 0.8, "coverage": 0.4,
                   "accuracy": 0.5, "answered": 2, "rows": 5,
                   "validation": {"coverage": 0.5, "accuracy": pytest.approx(2 / 3), "answered": 3, "rows": 6}}
    assert main(["calibration", str(test), "--validation", str(val), "--target-accuracy", "0.75"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == ["  abstention: answer when confidence >= 0.500, picked on the validation rows for accuracy >= 0.75",
                        "    on the validation rows it answers 4 of 6 rows (coverage 0.667), accuracy 0.750",
                        "    on these rows it answers 3 of 5 rows (coverage 0.600), accuracy 0.667"]


@pytest.mark.parametrize("flags, says", [
    (["--target-coverage", "0.5"], "pick a threshold on --validation FILE's rows: give it"),
    (["--validation", "VAL"], "--validation needs a target"),
    (["--validation", "VAL", "--target-coverage", "1.5"], "--target-coverage must lie in (0, 1], got 1.5"),
    (["--validation", "VAL", "--target-coverage", "0.9"], "--validation: coverage 0.9 is out of reach: 5 of 6 rows"),
    (["--validation", "VAL", "--target-accuracy", "1"], "--validation: no threshold reaches accuracy 1"),
])
def test_abstention_settings_are_checked(tmp_path, capsys, flags, says):
    val = _jsonl(tmp_path / "val.jsonl", [(0.9, 0), (0.8, 0), (0.8, 1), (0.5, 1), (None, 0), (0.2, 0)])
    test = _jsonl(tmp_path / "test.jsonl", [(0.95, 1), (0.1, 0)])
    assert main(["calibration", str(test), *[str(val) if f == "VAL" else f for f in flags]]) == 2
    assert says in capsys.readouterr().err
