"""Synthetic run directories, written the way `reflectrl train` and `reflectrl compare` write them."""

import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_script(name: str):
    """The module of ``benchmarks/NAME.py`` (the scripts are not a package; they import their shared ``resultio``)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_run(d: Path, env_id: str, method: str, seed: int, curve, final: float, total: int = 1000,
             extra: dict | None = None, algo: str = "ppo", wall: float = 3.0) -> Path:
    """A finished run: ``curve`` is [(global_step, episodic_return)], ``final`` the eval mean."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"algo": algo, "env_id": env_id, "seed": seed, "total_timesteps": total}
    (d / "config.json").write_text(json.dumps(cfg))
    recs = [{"update": i + 1, "global_step": s, "charts/episodic_return": r, **((extra or {}).get(s, {}))}
            for i, (s, r) in enumerate(curve)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "eval.json").write_text(json.dumps({"mean": final, "std": 0.0, "episodes": 2, "returns": [final, final]}))
    attempt = {"kind": "train", "wall_s": wall, "status": 0, "learn_s": wall / 4}
    (d / "run.json").write_text(json.dumps({"method": method, "algo": algo, "env_id": env_id, "seed": seed,
                                            "total_timesteps": total, "train_args": [], "attempts": [attempt]}))
    return d
