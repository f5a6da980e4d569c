"""The optimization half of the GRPO trainer: minibatches, gradient accumulation, exact merging of
identical rows, and the loss of one micro-batch (a registered policy loss, entropy, KL, the value loss
of ``--adv-estimator gae``, and the methods' auxiliary losses); the truncated importance-sampling
correction for an engine's log-probs (:func:`tis_weights`); under torchrun, the global loss normalizers and
the gradient sum of :mod:`reflectrl.llm.distributed`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..contract.base import AuxInputs
from ..contract.fields import LossInputs, read_by, register_field
from ..core import PolicyLossConfig, agg_loss, approx_kl, get_policy_loss, masked_mean, value_loss
from .batch import ENGINE_LOGP, TokenBatch
from .distributed import SINGLE, Dist

VALUE_HEAD = "value"
REPORT_ENTROPY = register_field("report_entropy", "token", "trainer",
                                "the report_entropy_coef of each token (0 off the self-report turn)")
TIS_WEIGHT = register_field("tis_weight", "token", "trainer",
                            "the per-token importance weights the policy loss is multiplied by (an engine's log-probs)")
ROW_ID = register_field("row_id", "row", "trainer", "each row's position in the update's batch (for auxiliary losses)")


def tis_weights(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor, cap: float | None
                ) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance sampling for the gap between the engine that sampled the tokens and the trainer:
    ``w = min(exp(logp_trainer - logp_engine), cap)`` per token ``[R, C]`` (1 outside ``mask`` and where the
    engine gave no finite log-prob; ``cap=None``: untruncated), and the gap's statistics: both log-probs' means,
    the KL(engine || trainer) k3 estimate on the engine's samples, the share of tokens the cap binds on and the
    weights' mean."""
    valid = mask.bool() & torch.isfinite(engine_logp) & torch.isfinite(trainer_logp)
    zero = torch.zeros_like(trainer_logp)
    eng, tr = torch.where(valid, engine_logp, zero), torch.where(valid, trainer_logp, zero)
    raw = (tr - eng).exp()
    w = torch.where(valid, raw if cap is None else raw.clamp(max=cap), torch.ones_like(raw))
    m = valid.float()
    capped = (raw > cap).float() if cap is not None else zero
    return w, {"rollout/engine_logp_mean": float(masked_mean(eng, m)), "rollout/trainer_logp_mean": float(masked_mean(tr, m)),
               "rollout/engine_trainer_kl": float(masked_mean(approx_kl(eng, tr, "k3"), m)),
               "rollout/tis_capped_frac": float(masked_mean(capped, m)), "rollout/tis_weight_mean": float(masked_mean(w, m))}


def _packed_cost(layout: str, prompts: int, rows: int, p_max: int, r_max: int, t_max: int) -> int:
    """The tokens a micro-batch of ``rows`` rows (``prompts`` distinct prompts) computes under ``layout``, its longest
    prompt, response and row being ``p_max``, ``r_max`` and ``t_max`` tokens."""
    if layout == "causal":
        return rows * t_max
    if layout == "shared-prompt":
        return prompts * p_max + rows * r_max
    return rows * (p_max + r_max)


@dataclass
class _Micro:
    """What every term of a micro-batch's loss shares: the device, the policy-token mask, the old log-probs, the
    (shaped, weighted) advantages, the loss mask and row weights of the multiplicities, the rescaling of the per-row
    modes, the statistics' mask, and whether the aggregation is token-mean."""

    dev: torch.device
    mask: Tensor
    old: Tensor
    adv: Tensor
    m_loss: Tensor
    row_w: Tensor
    scale: float
    m_stat: Tensor
    token_mean: bool


class PolicyUpdate:
    """Mixed into :class:`~reflectrl.llm.grpo.GRPO` (uses its ``cfg``, ``policy``, ``optimizer``,
    ``gen``, ``methods``, ``update_idx`` and ``finite``)."""

    cfg: Any
    policy: Any
    optimizer: torch.optim.Optimizer
    gen: torch.Generator
    methods: list[Any]
    needs: set[str]
    update_idx: int
    _dedupe: bool
    dist: Dist = SINGLE  # the process group of a torchrun run (one process: every collective is skipped)
    rank_gen: torch.Generator | None = None  # this process's generator of the update, under torchrun
    finite: Any

    def loss_config(self) -> PolicyLossConfig:
        c = self.cfg
        return PolicyLossConfig(clip_ratio_low=c.clip_low, clip_ratio_high=c.clip_high, clip_ratio_c=c.clip_c,
                                log_ratio_clamp=c.log_ratio_clamp, norm_len=c.norm_len)

    def _normalizer(self, b: TokenBatch) -> float:
        """What ``agg_loss`` divides by for these rows, so micro-batch losses add up to the minibatch's."""
        if self.cfg.loss_agg_mode == "token-mean":
            return float(b.completion_mask.sum())
        return float((b.completion_mask.sum(1) > 0).sum())

    def distinct_rows(self, mb: TokenBatch) -> tuple[TokenBatch, torch.Tensor | None]:
        """Rows of one group with the same tokens, masks and advantages have the same loss and gradient:
        keep the first of each with its multiplicity (``None``: all rows are distinct)."""
        key = torch.cat([mb.index[:, None], torch.where(mb.prompt_mask, mb.prompt_ids, -1),
                         torch.where(mb.response_attention, mb.response_ids, -1), mb.completion_mask.long()], 1)
        _, inv, counts = torch.unique(key, dim=0, return_inverse=True, return_counts=True)
        if counts.numel() == mb.rows:
            return mb, None
        first = torch.full((counts.numel(),), mb.rows).scatter_reduce(0, inv, torch.arange(mb.rows), "amin")
        loss_inputs = [*read_by(mb.extras, "loss").values(), mb.extras.get(TIS_WEIGHT)]
        for t in (mb.advantages, mb.weights, *loss_inputs):
            if t is not None and not torch.equal(t, t[first][inv]):
                return mb, None
        order = first.argsort()
        return mb.select(first[order]), counts[order].float()

    def micro_loss(self, mb: TokenBatch, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one micro-batch, aggregated as configured; row r stands for ``counts[r]`` identical
        rows when given (:meth:`distinct_rows`): the policy term, then the entropy, KL and value terms, then each
        method's auxiliary loss, added in that order."""
        cfg = self.cfg
        want_hidden = "hidden_grad" in self.needs or mb.values is not None
        report_w = mb.extras.get(REPORT_ENTROPY)  # [R, C]: report_entropy_coef on the self-report turn's tokens
        out = self.policy.forward_batch(mb, with_entropy=True, with_hidden=want_hidden, temperature=cfg.temperature,
                                        entropy_grad=cfg.entropy_coef > 0 or report_w is not None)
        m = self._micro_weights(mb, out.logp, counts)
        loss, stats = self._policy_term(mb, out, m, counts)
        loss = self._regularizers(loss, stats, mb, out, m, report_w)
        return self._method_terms(loss, mb, out, m), stats

    def _micro_weights(self, mb: TokenBatch, logp: Tensor, counts: Tensor | None) -> _Micro:
        """The masks, row weights and rescaling that make ``counts``-weighted distinct rows equal the full rows."""
        cfg = self.cfg
        dev = logp.device
        mask = mb.completion_mask.float().to(dev)
        old = mb.old_logp.to(dev) if mb.old_logp is not None else logp.detach()
        adv = (mb.advantages if mb.weights is None else mb.advantages * mb.weights).to(dev)
        tis = mb.extras.get(TIS_WEIGHT)
        if tis is not None:  # each token's policy-loss term times its importance weight (w > 0: the same as on A)
            adv = adv * tis.to(dev)
        c = torch.ones(mb.rows, device=dev) if counts is None else counts.to(dev)
        token_mean = cfg.loss_agg_mode == "token-mean"
        # multiplicities: token-mean weighs the mask; the per-row modes weigh the rows' terms and rescale
        m_loss = mask * c[:, None] if token_mean else mask
        row_w = torch.ones_like(c[:, None]) if token_mean else c[:, None]
        has = (mask.sum(1) > 0).float()
        scale = 1.0 if token_mean or counts is None else float(has.sum() / (has * c).sum())
        return _Micro(dev, mask, old, adv, m_loss, row_w, scale, mask * c[:, None], token_mean)

    def _agg(self, x: Tensor, m: _Micro) -> Tensor:
        return agg_loss(x * m.row_w, m.m_loss, self.cfg.loss_agg_mode, self.cfg.norm_len) * m.scale

    def _policy_term(self, mb: TokenBatch, out: Any, m: _Micro, counts: Tensor | None
                     ) -> tuple[Tensor, dict[str, Tensor]]:
        """The registered policy loss on :class:`LossInputs` (with the loss fields of ``mb.extras``), and its stats
        (token-weighted when rows carry multiplicities)."""
        cfg = self.cfg
        loss_fn, lc = get_policy_loss(cfg.policy_loss), self.loss_config()
        li = LossInputs(m.old, out.logp, m.adv * m.row_w, m.m_loss,
                        {k: v.to(m.dev) for k, v in read_by(mb.extras, "loss").items()})
        loss, st = loss_fn(li.old_logp, li.logp, li.advantages, li.mask, cfg.loss_agg_mode, lc, **li.extra)
        loss = loss * m.scale
        if counts is not None and not m.token_mean:  # token-weighted diagnostics
            _, st = loss_fn(m.old, out.logp.detach(), m.adv, m.m_stat, "token-mean", lc, **li.extra)
        stats = {"losses/policy_loss": loss.detach(), "losses/entropy": masked_mean(out.entropy.detach(), m.m_stat),
                 **{f"losses/{k}": v for k, v in st.items() if k != "old_approx_kl"}}
        return loss, stats

    def _regularizers(self, loss: Tensor, stats: dict[str, Tensor], mb: TokenBatch, out: Any, m: _Micro,
                      report_w: Tensor | None) -> Tensor:
        """``loss`` with the entropy bonuses (all tokens; the self-report turn's), the KL to the reference and the
        critic's value loss added, each as configured; their stats go into ``stats``."""
        cfg = self.cfg
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * self._agg(out.entropy, m)
        if report_w is not None:
            w = report_w.to(m.dev)
            loss = loss - self._agg(out.entropy * w, m)
            stats["losses/report_entropy"] = masked_mean(out.entropy.detach(), m.m_stat * (w > 0))
        if mb.ref_logp is not None:
            kl = approx_kl(out.logp, mb.ref_logp.to(m.dev), cfg.kl_estimator)
            stats["losses/kl"] = masked_mean(kl.detach(), m.m_stat)
            if cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * self._agg(kl, m)
        if mb.values is not None:  # the critic of --adv-estimator gae: a value head on the hidden states
            v = self.policy.head(VALUE_HEAD, out.hidden).float()
            vl = value_loss(v, mb.values.to(m.dev), mb.returns.to(m.dev), m.m_stat, cfg.value_clip)
            stats["losses/value_loss"] = vl.detach()
            loss = loss + cfg.vf_coef * vl
        return loss

    def _method_terms(self, loss: Tensor, mb: TokenBatch, out: Any, m: _Micro) -> Tensor:
        """``loss`` plus each method's auxiliary loss on this micro-batch's policy tokens."""
        rows = mb.extras.get(ROW_ID)
        for runner in self.methods:
            if runner.has_aux_loss and rows is not None:
                r, t = m.mask.bool().nonzero(as_tuple=True)
                extra = runner.aux_loss(AuxInputs(rows.to(m.dev)[r], t, out.logp[r, t], m.old[r, t], self._batch_shape))
                if extra is not None:
                    loss = loss + extra
        return loss

    def _micro_splits(self, mb: TokenBatch | None) -> list[Tensor]:
        """The rows of each micro-batch of ``mb``: ``grad_accum`` equal splits, or (``micro_batch_tokens`` N) the
        rows packed in order into micro-batches of at most N tokens as the layout computes them. Padded and causal
        layouts: rows sorted by length, a micro-batch costing its rows times the longest prompt plus the longest
        response (the longest row under the causal layout). Shared-prompt layout: the rows of a prompt kept together
        (prompts in order of their longest row), a micro-batch costing its distinct prompts times the longest prompt
        plus its rows times the longest response."""
        cap = self.cfg.micro_batch_tokens
        if mb is None or not cap:
            return list(torch.tensor_split(torch.arange(mb.rows if mb is not None else 0), self.cfg.grad_accum))
        prompt = mb.prompt_mask.sum(1)
        response = mb.last_real_response() + 1
        layout = self.cfg.attention
        if layout == "shared-prompt":
            keys = [tuple(q) for q in mb.prompt_tokens()]
            groups: dict[tuple[int, ...], list[int]] = {}
            for r in torch.argsort(response, stable=True).tolist():
                groups.setdefault(keys[r], []).append(r)
            order = [r for g in sorted(groups.values(), key=lambda g: int(prompt[g[0]] + response[g[-1]])) for r in g]
        else:
            keys, order = [], torch.argsort(prompt + response, stable=True).tolist()
        out: list[Tensor] = []
        cur: list[int] = []
        seen: set[tuple[int, ...]] = set()
        p_max = r_max = t_max = 0
        for r in order:
            p, q = int(prompt[r]), int(response[r])
            np_, nr, nt = max(p_max, p), max(r_max, q), max(t_max, p + q)
            n_prompts = len(seen) + (keys[r] not in seen) if keys else 0
            if cur and _packed_cost(layout, n_prompts, len(cur) + 1, np_, nr, nt) > cap:
                out.append(torch.tensor(cur))
                cur, np_, nr, nt = [], p, q, p + q
                seen.clear()
            cur.append(r)
            if keys:
                seen.add(keys[r])
            p_max, r_max, t_max = np_, nr, nt
        return [*out, torch.tensor(cur)] if cur else out

    def _accumulate(self, mb: TokenBatch | None, norm: float, steps: int) -> tuple[bool, dict[str, float]]:
        """Backpropagate one minibatch's micro-batches, each loss weighted by its share of ``norm``; whether every
        loss was finite, and the weighted sums of their stats: the policy loss by the loss's weights, the token means
        (entropy, clip fractions, KL) by each micro-batch's share of the policy tokens, so that they are the unsplit
        minibatch's whatever the loss's aggregation."""
        acc: dict[str, float] = {}
        if mb is not None:  # the token means are weighted by token shares, of this process's share of the loss
            whole, tokens = self._normalizer(mb) / norm, float(mb.completion_mask.sum())
        for micro_rows in self._micro_splits(mb):
            if mb is None or not micro_rows.numel():
                continue
            micro = mb.select(micro_rows)
            w = self._normalizer(micro) / norm
            share = whole * float(micro.completion_mask.sum()) / tokens if tokens else w
            if w == 0:
                continue
            rows, counts = self.distinct_rows(micro) if self._dedupe else (micro, None)
            loss, st = self.micro_loss(rows, counts)
            finite = (bool(torch.isfinite(loss.detach()).all()) if self.dist.active
                      else self.finite("the loss", loss.detach(), f"minibatch {steps + 1}"))
            if not finite:
                return False, acc
            (loss * w).backward()
            for k, v in st.items():
                acc[k] = acc.get(k, 0.0) + (w if k == "losses/policy_loss" else share) * float(v)
        return True, acc

    def _step(self, params: list[torch.nn.Parameter]) -> float:
        """Clip the gradients (``max_grad_norm`` > 0) and step; the gradient norm before the clip."""
        if self.cfg.max_grad_norm > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        else:
            gn = torch.norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        self.optimizer.step()
        return float(gn)

    def engine_correction(self, batch: TokenBatch) -> dict[str, float]:
        """When the engine gave its log-probs (``extras[ENGINE_LOGP]``) and the no-grad pass the trainer's
        (``old_logp``): the TIS weights of the loss (unless ``tis_cap`` is None) and the gap's metrics."""
        eng = batch.extras.get(ENGINE_LOGP)
        if eng is None or batch.old_logp is None or self.cfg.old_logp == "engine":  # engine: no gap to correct
            return {}
        C = batch.steps
        w, stats = tis_weights(batch.old_logp[:, :C].float(), eng[:, :C].float(), batch.completion_mask,
                               self.cfg.tis_cap)
        if self.cfg.tis_cap is not None:
            batch.extras[TIS_WEIGHT] = w
        return stats

    def _finite_everywhere(self, name: str, x: Tensor | None, where: str = "") -> bool:
        """:meth:`finite` on every process at once under torchrun (one process's NaN stops or skips them all)."""
        if not self.dist.active:
            return self.finite(name, x, where)
        (bad,) = self.dist.any(x is not None and not bool(torch.isfinite(x).all()))
        return self.finite(name, torch.tensor(float("nan")), where) if bad else True

    def _sum_grads(self, params: list[torch.nn.Parameter], ok: bool, step: int) -> bool:
        """Under torchrun: sum the gradients over the processes, unless one of them met a non-finite loss (then
        every process stops, or skips the step)."""
        (bad,) = self.dist.any(not ok)
        if bad:
            self.optimizer.zero_grad(set_to_none=True)
            return self.finite("the loss", torch.tensor(float("nan")), f"minibatch {step + 1} (on some process)")
        self.dist.sum_grads_(params)
        return True

    def update(self, batch: TokenBatch | None) -> dict[str, float]:
        """``ppo_epochs`` passes of ``minibatches`` optimizer steps, each accumulated over ``grad_accum``
        micro-batches whose losses are weighted to equal the loss of the whole minibatch. Under torchrun the
        weights are of the global minibatch (the processes' normalizers summed) and the gradients are summed
        before the clip and the step; a process with no rows of its own (``None``) still takes part."""
        cfg, dist = self.cfg, self.dist
        if cfg.lr_schedule == "linear":
            self.optimizer.param_groups[0]["lr"] = (1.0 - (self.update_idx - 1) / cfg.updates) * cfg.learning_rate
        params = self.policy.trainable_parameters()
        self.policy.train()
        totals: dict[str, float] = {}
        steps = 0
        usable = self._finite_everywhere("the advantages", None if batch is None else batch.advantages)
        n_rows = 0 if batch is None else batch.rows
        gen = self.rank_gen if dist.active and self.rank_gen is not None else self.gen
        for _ in range(cfg.ppo_epochs if usable else 0):
            order = torch.randperm(n_rows, generator=gen) if cfg.minibatches > 1 else torch.arange(n_rows)
            for mb_rows in torch.tensor_split(order, cfg.minibatches):
                mb = batch.select(mb_rows) if batch is not None and mb_rows.numel() else None
                norm = self._normalizer(mb) if mb is not None else 0.0
                if dist.active:
                    norm = dist.sum_floats([norm])[0]
                if norm == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                ok, acc = self._accumulate(mb, norm, steps)
                if dist.active:
                    ok = self._sum_grads(params, ok, steps)
                if not ok:
                    continue
                acc["losses/grad_norm"] = self._step(params)
                for k, v in acc.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        self.policy.eval()
        out = {k: v / max(steps, 1) for k, v in totals.items()}
        out["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        out["losses/optimizer_steps"] = steps
        if getattr(self, "skipped", 0):
            out["health/skipped"] = self.skipped
        return out
