"""A scripted generation engine for toy-add with a self-report turn (the tests of the self-report terms and of the
collapse alarm)."""

from __future__ import annotations

from typing import Any


class ScriptedReports:
    """Row i answers right when i is even, wrong otherwise. Its report: with ``constant``, "unsolved" / 0.5 for
    every row; else "solved" / 0.9 for i // 2 even and "unsolved" / 0.2 otherwise (every group of 4 holds each
    pair of outcome and report)."""

    def __init__(self, policy: Any, constant: bool = False):
        self.tok, self.eos, self.constant = policy.tokenizer, policy.eos_ids[0], constant

    def generate(self, prompts, max_new_tokens, generator, greedy=False, stop_ids=()):
        out = []
        for i, ids in enumerate(prompts):
            text = self.tok.decode(ids, skip_special_tokens=True)
            high = not self.constant and (i // 2) % 2 == 0
            if "unsolved?" in text:
                word = "solved" if high else "unsolved"
            elif "confidence (0-1)?" in text:
                word = "0.5" if self.constant else "0.9" if high else "0.2"
            else:
                a, b = text.strip().rstrip("=").split("+")
                word = str(int(a) + int(b) + (0 if i % 2 == 0 else 1))
            out.append(self.tok(word, add_special_tokens=False)["input_ids"] + [self.eos])
        return out

    def sync(self, policy: Any) -> None:
        pass


def script(trainer: Any, constant: bool = False) -> Any:
    """``trainer`` with its engine replaced by :class:`ScriptedReports`."""
    trainer.engine = trainer.rollout.engine = ScriptedReports(trainer.policy, constant)
    return trainer
