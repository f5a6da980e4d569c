"""reflectrl calibration FILE.jsonl: the metrics of llm eval, reproduced from its own dumped rows; bad rows in one
line each."""

import json

import pytest

from reflectrl.cli import main


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
    assert ev["ece"] is not None and ev["reflection_accuracy"] is not None  # the model states both reports
    assert (tmp_path / "fig" / "reliability.png").is_file() and (tmp_path / "fig" / "risk_coverage.png").is_file()


def test_bad_rows_one_line_each(tmp_path, capsys):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join([json.dumps({"correct": True, "confidence": 0.9}), "not json",
                            json.dumps({"confidence": 0.5}), json.dumps({"correct": 1, "confidence": 1.5}),
                            json.dumps({"acc": 0.0, "confidence": -1.0, "reflection": 1})]) + "\n")
    assert main(["calibration", str(f)]) == 2
    err = capsys.readouterr().err
    assert "3 bad rows" in err and "line 2:" in err and "line 3: no correctness" in err
    assert "line 4: confidence out of range: 1.5" in err
    assert main(["calibration", str(f), "--skip-bad", "--json", "--reps", "20"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("warning:") == 3
    res = json.loads(cap.out)
    assert res["rows"] == 2 and res["confidence_missing_rate"]["value"] == 0.5  # verl's -1: asked, not stated
