"""Every speed ratio that README.md and BENCHMARKS.md quote from a results file with per-round data is the median of
that file's per-round paired ratios (both arms of a round measured under the same load), not a ratio of medians."""

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results"


def _median_ok(headline: float, rounds: list[float]) -> bool:
    return abs(headline - statistics.median(rounds)) <= 1e-9 + 5e-4 * abs(headline)


def test_speed_ratio_files_are_medians_of_paired_rounds():
    """Recomputed from each file's own per-round data, nothing changes (benchmarks/speed_ratios.py --check)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import speed_ratios
    finally:
        sys.path.pop(0)
    paths = speed_ratios.files()
    assert len(paths) >= 10
    stale = [p.name for p in paths if speed_ratios.recomputed(p) != json.loads(p.read_text())]
    assert not stale, f"python benchmarks/speed_ratios.py: {stale}"


def test_every_headline_ratio_is_its_rounds_median():
    """The files whose ratios were medians of paired rounds from the start (PPO, overhead, the self-report costs),
    and those recomputed: each headline ratio against the median of the per-round ratios beside it."""
    checked = 0
    for path in sorted(RES.glob("*.json")):
        r = json.loads(path.read_text())
        pairs = []
        if path.name.startswith("ppo_") and "ratios" in r:
            pairs += [(r["ratio_median"], r["ratios"])] + [(r[f"{k}_ratio_median"], r[f"{k}_ratios"])
                                                           for k in ("loop", "sync") if f"{k}_ratios" in r]
        if r.get("benchmark") == "llm_throughput":
            for arm, key in (("reflectrl", "ratio"), ("reflectrl_engine_logp", "ratio_engine_logp"),
                             ("reflectrl_shared_prompt", "ratio_shared_prompt")):
                if arm in r["rounds"]:
                    pairs.append((r[key], [a / b for a, b in zip(r["rounds"][arm], r["rounds"]["trl"])]))
        if r.get("benchmark") == "llm_update_speed":
            before = r["arms"]["before"]["rounds"]
            pairs += [(v["speedup"], [b / x for b, x in zip(before, v["rounds"])]) for v in r["arms"].values()]
        if r.get("benchmark") == "llm_decode_step":
            pairs.append((r["speedup"], [f / x for f, x in zip(r["rounds"]["forward"], r["rounds"]["lean"])]))
        for v in r.values() if path.name.startswith(("overhead", "llm_overhead")) else ():
            if isinstance(v, dict) and "wall_ratios" in v:
                pairs.append((v["wall_ratio"], v["wall_ratios"]))
            if isinstance(v, dict) and "ratios_per_token" in v:
                pairs.append((v["ratio_per_token"], v["ratios_per_token"]))
        for v in r.get("pairs", {}).values() if path.name.startswith("selfreport_cost") else ():
            pairs.append((v["ratio"], v["ratios"]))
        for headline, rounds in pairs:
            assert _median_ok(headline, rounds), (path.name, headline, rounds)
            checked += 1
    assert checked >= 50


def test_the_readme_and_benchmarks_quote_those_ratios():
    """The ratios README's summary and BENCHMARKS.md's throughput lines print are those medians (to the digits
    printed): PPO against CleanRL, and reflectrl's GRPO step against TRL's."""
    readme, bench = (ROOT / "README.md").read_text(), (ROOT / "BENCHMARKS.md").read_text()
    thr, ppo = json.loads((RES / "llm_throughput.json").read_text()), json.loads((RES / "ppo_speed.json").read_text())
    assert f"at {statistics.median(a / b for a, b in zip(thr['rounds']['reflectrl'], thr['rounds']['trl'])):.1f}x TRL's" \
        in readme
    assert f"runs {statistics.median(ppo['ratios']):.1f}x faster than CleanRL's loop" in readme
    for name in ("llm_throughput.json", "llm_throughput_real.json"):
        r = json.loads((RES / name).read_text())
        med = statistics.median(a / b for a, b in zip(r["rounds"]["reflectrl"], r["rounds"]["trl"]))
        assert re.search(rf"reflectrl \*\*{med:.2f}x\*\* \(rounds", bench), name
