"""Where does refgrpo-seed's calibration bonus fall? b_cal over two observation dimensions.

A finished (or checkpointed) ``refgrpo-seed`` run is loaded from its run directory; its policy
collects ``rollouts`` fresh batches exactly as in training (same vector env, same batch shape),
GAE gives the advantages, and the run's own reflection predictor gives
``b_cal = -alpha * (f(s, a) - target)^2`` at every step (before clipping and beta, with the run's
``--cal-target`` and ``--cal-alpha``). Nothing is written to the run directory. For LunarLander
observation dimensions 0 and 1 are the lander's x and y position (Gymnasium's lunar_lander.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError


def bcal_samples(run_dir: str | Path, rollouts: int = 1, dims: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray]:
    """Per-step ``pos [N, 2]`` (raw observation dims ``dims``), ``b_cal [N]``, ``f [N]``, ``target [N]``."""
    from ..algos import resume, run_algo
    from ..methods.refgrpo_seed import RefGRPOSeed, calibration_bonus, normalized_advantages

    run_dir = Path(run_dir)
    name = run_algo(run_dir).name
    if name != "refgrpo-seed":
        raise ConfigError(f"{run_dir} is a run of {name}; the b_cal map needs a refgrpo-seed run")
    if rollouts < 1:
        raise ConfigError("--rollouts must be at least 1")
    trainer = resume(run_dir, progress=False, tensorboard=False)
    hook = next(h for h in trainer.hooks if isinstance(getattr(h, "method", None), RefGRPOSeed))
    method = hook.method
    obs_dim = trainer.envs.single_observation_space.shape[0]
    if not all(0 <= d < obs_dim for d in dims):
        raise ConfigError(f"--dims {dims} out of range for {trainer.cfg.env_id} ({obs_dim} observation dims)")
    pos, bcal, fs, targets = [], [], [], []
    with torch.no_grad():
        for _ in range(rollouts):
            b, _ = trainer.rollout()
            trainer.advantages(b)
            _, feats = hook.features(trainer, b)
            f = method.net(feats.reshape(-1, feats.shape[-1]))[:, 0]
            adv = b.advantages.reshape(-1)
            target = adv if method.o.cal_target == "raw" else normalized_advantages(b.advantages).reshape(-1)
            obs = b.obs.reshape(-1, obs_dim).double().numpy()
            if trainer.obs_norm is not None:  # back to the env's coordinates (exact inside the clip range)
                rms = trainer.obs_norm.rms
                obs = obs * np.sqrt(rms.var + trainer.obs_norm.eps) + rms.mean
            pos.append(obs[:, list(dims)])
            bcal.append(calibration_bonus(f, target, method.o.cal_alpha).numpy())
            fs.append(f.numpy())
            targets.append(target.numpy())
    trainer.envs.close()
    return {"pos": np.concatenate(pos), "b_cal": np.concatenate(bcal), "f": np.concatenate(fs),
            "target": np.concatenate(targets)}


def plot_bcal_map(run_dir: str | Path, out: str | Path, rollouts: int = 1, dims: tuple[int, int] = (0, 1),
                  gridsize: int = 30) -> Path:
    """Hexbin map of the mean b_cal per cell of observation dims ``dims``, beside the visit counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = bcal_samples(run_dir, rollouts, dims)
    x, y = s["pos"][:, 0], s["pos"][:, 1]
    lunar = "LunarLander" in str(_env_id(run_dir)) and tuple(dims) == (0, 1)
    xl, yl = ("x position", "y position") if lunar else (f"obs[{dims[0]}]", f"obs[{dims[1]}]")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    hb = axes[0].hexbin(x, y, C=s["b_cal"], reduce_C_function=np.mean, gridsize=gridsize, cmap="viridis")
    fig.colorbar(hb, ax=axes[0], label="mean b_cal")
    axes[0].set_title(f"b_cal over ({xl}, {yl})")
    hc = axes[1].hexbin(x, y, gridsize=gridsize, bins="log", cmap="Greys")
    fig.colorbar(hc, ax=axes[1], label="steps (log)")
    axes[1].set_title(f"visits ({len(x)} steps)")
    for ax in axes:
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
    name = "/".join(Path(os.path.abspath(run_dir)).parts[-3:])  # the path as given (a linked run keeps its label)
    fig.suptitle(f"{name}: refgrpo-seed calibration bonus, mean {s['b_cal'].mean():.3g}")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _env_id(run_dir: str | Path) -> str:
    import json

    try:
        return json.loads((Path(run_dir) / "config.json").read_text()).get("env_id", "")
    except (OSError, ValueError):
        return ""
