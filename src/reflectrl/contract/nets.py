"""Small learned parts shared by the methods: scalar MLP heads on generic features, and their fit.

The reflection predictor (refgrpo-seed), the distilled value head (gear-seed) and the reflection
network (exgrpo-seed) are all a :class:`ScalarMLP` on a ``[N, F]`` features tensor: observation
(+ action) in the control front end, a policy's hidden states in the LLM front end. Every net is
initialized from an explicit generator, so a method never draws from the trainer's random streams.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F


class ScalarMLP(nn.Module):
    """``members`` independent MLPs ``[in -> hidden (ReLU) ... -> 1]``, evaluated as one batched
    matmul per layer; ``forward(x [N, in]) -> [N, members]``.

    Hidden layers use PyTorch's default Linear init; the output layer has weights ~N(0, out_std²)
    and bias 0, so an untrained head outputs about 0. ``squash="sym_sigmoid"`` maps the output
    through ``sigmoid(z) * 2 - 1`` into [-1, 1]. ``hidden=()`` is a linear head.
    """

    def __init__(self, in_dim: int, hidden: tuple[int, ...] = (64, 64), members: int = 1, out_std: float = 0.01,
                 dropout: float = 0.0, squash: str | None = None, generator: torch.Generator | None = None):
        super().__init__()
        if squash not in (None, "sym_sigmoid"):
            raise ValueError(f"unknown squash {squash!r}")
        sizes = [int(in_dim), *map(int, hidden), 1]
        self.members, self.dropout, self.squash = int(members), float(dropout), squash
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = torch.empty(self.members, fan_in, fan_out)
            b = torch.empty(self.members, 1, fan_out)
            if i == len(sizes) - 2:
                w.normal_(0.0, out_std, generator=generator)
                b.zero_()
            else:
                bound = 1.0 / math.sqrt(fan_in)
                w.uniform_(-bound, bound, generator=generator)
                b.uniform_(-bound, bound, generator=generator)
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(b))

    def forward(self, x: Tensor) -> Tensor:
        """Outputs of every member, ``[N, members]``."""
        last = len(self.weights) - 1
        if self.members == 1:
            h = x
            for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                h = torch.addmm(b.view(-1), h, w.view(w.shape[1], w.shape[2]))
                if i < last:
                    h = self._hidden(h)
        else:
            h = x.unsqueeze(0).expand(self.members, *x.shape)
            for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                h = torch.baddbmm(b, h, w)
                if i < last:
                    h = self._hidden(h)
            h = h.squeeze(-1).T
        if self.squash == "sym_sigmoid":
            h = torch.sigmoid(h) * 2.0 - 1.0
        return h

    def _hidden(self, h: Tensor) -> Tensor:
        h = torch.relu(h)
        return F.dropout(h, self.dropout, self.training) if self.dropout > 0 else h


def adam_for(net: nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """The optimizer every method head uses: Adam (fused kernel; ``weight_decay`` is an L2 penalty)."""
    return torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


def fit_regression(net: ScalarMLP, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, epochs: int,
                   minibatches: int, generator: torch.Generator) -> tuple[float, float]:
    """``epochs`` passes of minibatch MSE regression of every member of ``net`` onto ``y [N]``.

    Returns ``(first_epoch_loss, last_epoch_loss)`` (means over their minibatches); with one
    minibatch the first is the loss before any step on this data."""
    n = x.shape[0]
    if n == 0:
        return float("nan"), float("nan")
    y = y.reshape(n, 1)
    size = max(1, math.ceil(n / max(1, minibatches)))
    net.train()
    fast = _HandMSE(net) if hand_gradients_apply(net) else None
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator) if minibatches > 1 else None
        acc, k = torch.zeros(()), 0
        for start in range(0, n, size):
            idx = None if perm is None else perm[start:start + size]
            xb, yb = (x, y) if idx is None else (x[idx], y[idx])
            if fast is not None:
                loss = fast(xb, yb)
            else:
                loss = (net(xb) - yb).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            acc += loss.detach()
            k += 1
        losses.append(acc / k)
    net.eval()
    return float(losses[0]), float(losses[-1])


def hand_gradients_apply(net: ScalarMLP) -> bool:
    """Whether :class:`_HandMSE` computes ``net``'s gradients: one member, ReLU layers, no dropout,
    no squash (the default heads)."""
    return net.members == 1 and net.dropout == 0.0 and net.squash is None


class _HandMSE:
    """MSE regression steps of a one-member ReLU :class:`ScalarMLP` with the gradients computed by
    explicit backpropagation into preallocated ``.grad`` buffers (the values autograd gives;
    ``tests/methods`` checks them). At the methods' sizes a step is compute-light and autograd's
    bookkeeping is a large share of it; by hand it costs about half."""

    def __init__(self, net: ScalarMLP):
        self.w = [w.detach().view(w.shape[1], w.shape[2]) for w in net.weights]
        self.b = [b.detach().view(-1) for b in net.biases]
        self.gw, self.gb = [], []
        for w, b in zip(net.weights, net.biases):
            w.grad, b.grad = torch.empty_like(w), torch.empty_like(b)
            self.gw.append(w.grad.view(w.shape[1], w.shape[2]))
            self.gb.append(b.grad.view(-1))

    @torch.no_grad()
    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        """Fill the gradients of ``mean((net(x) - y)^2)`` for ``x [N, in]``, ``y [N, 1]``; return the loss."""
        last = len(self.w) - 1
        acts = [x]
        h = x
        for i in range(last + 1):
            h = torch.addmm(self.b[i], h, self.w[i])
            if i < last:
                h = h.relu_()
                acts.append(h)
        err = h.sub_(y)
        loss = err.pow(2).mean()
        g = err.mul_(2.0 / err.numel())
        for i in range(last, -1, -1):
            torch.mm(acts[i].T, g, out=self.gw[i])
            torch.sum(g, 0, out=self.gb[i])
            if i > 0:
                g = torch.mm(g, self.w[i].T).mul_(acts[i] > 0)
        return loss


def control_features(obs: Tensor, actions: Tensor | None, num_actions: int | None) -> Tensor:
    """Per-step features of the control front end: observation, then the action (one-hot when
    ``num_actions`` is given, raw otherwise); ``obs [..., F]``, ``actions [...]`` or ``[..., A]``."""
    if actions is None:
        return obs
    if num_actions is not None:
        act = F.one_hot(actions.long(), num_actions).to(obs.dtype)
    else:
        act = actions.to(obs.dtype).reshape(*obs.shape[:-1], -1)
    return torch.cat([obs, act], -1)
