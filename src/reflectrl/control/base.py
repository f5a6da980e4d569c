"""What the control trainers (PPO, DQN) share on top of the trainer skeleton: the two numbers beside the
progress bar, closing the vector env, and the summary line a run prints at its end."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..trainer import Clock, Trainer


class EnvTrainer(Trainer):
    """A :class:`~reflectrl.trainer.Trainer` over a Gymnasium vector env (``self.envs``) that keeps the
    returns of its latest finished episodes in ``self.recent_returns``."""

    def bar_values(self, rec: dict[str, Any]) -> tuple[float, float | None]:
        return rec["charts/SPS"], float(np.mean(self.recent_returns)) if self.recent_returns else None

    def close(self) -> None:
        self.envs.close()

    def summary(self, clock: Clock, start: int) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "global_step": self.global_step, "updates": self.update_idx,
                "sps": (self.global_step - start) / max(clock.wall, 1e-9), "wall_s": clock.wall,
                "recent_return": float(np.mean(self.recent_returns)) if self.recent_returns else None}
