"""Actor-critics for discrete (categorical) and continuous (Gaussian, state-independent log-std) actions.

Sampling and log-probabilities are written out with tensor ops instead of ``torch.distributions``:
same math, a fraction of the per-call overhead, which dominates for small MLPs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
_LOG_2PI = math.log(2 * math.pi)


def mlp(sizes: list[int], activation: str, ortho: bool, out_std: float) -> nn.Sequential:
    """An MLP with ``activation`` between layers; orthogonal init (sqrt 2 hidden, ``out_std`` last) if ``ortho``."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        if ortho:
            last = i == len(sizes) - 2
            nn.init.orthogonal_(lin.weight, out_std if last else math.sqrt(2))
            nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


class TwinMLP(nn.Module):
    """Actor and critic MLPs of the same hidden widths, evaluated together: the first layers share
    one matmul (weights concatenated), deeper hidden layers run as one batched matmul over the pair,
    and each output layer is its own matmul. The same function as two separate MLPs in fewer,
    larger kernel calls, which is what small-MLP PPO on a CPU is bound by."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], out_actor: int, activation: str, ortho: bool):
        super().__init__()
        self.act_fn = {"tanh": torch.tanh, "relu": torch.relu}[activation]
        nets = [mlp([obs_dim, *hidden, out_actor], activation, ortho, 0.01),
                mlp([obs_dim, *hidden, 1], activation, ortho, 1.0)]
        lins = [[m for m in n if isinstance(m, nn.Linear)] for n in nets]
        self.w_in = nn.Parameter(torch.cat([lins[0][0].weight.T, lins[1][0].weight.T], 1).contiguous())
        self.b_in = nn.Parameter(torch.cat([lins[0][0].bias, lins[1][0].bias]))
        self.w_hid = nn.ParameterList(
            nn.Parameter(torch.stack([lins[0][i].weight.T, lins[1][i].weight.T]).contiguous())
            for i in range(1, len(hidden)))
        self.b_hid = nn.ParameterList(
            nn.Parameter(torch.stack([lins[0][i].bias, lins[1][i].bias])[:, None, :].contiguous())
            for i in range(1, len(hidden)))
        self.w_actor, self.b_actor = nn.Parameter(lins[0][-1].weight.T.contiguous()), nn.Parameter(lins[0][-1].bias.clone())
        self.w_critic, self.b_critic = nn.Parameter(lins[1][-1].weight.T.contiguous()), nn.Parameter(lins[1][-1].bias.clone())
        self.h0 = hidden[0]

    def trunk(self, obs: Tensor) -> Tensor:
        """Last hidden activations of both nets, ``[2, batch, width]`` (0 = actor, 1 = critic)."""
        h = self.act_fn(torch.addmm(self.b_in, obs, self.w_in))
        h = h.view(obs.shape[0], 2, self.h0).transpose(0, 1)
        # the lists' parameters in order, without ParameterList's per-item __getattr__ (a per-step cost)
        for w, b in zip(self.w_hid._parameters.values(), self.b_hid._parameters.values()):
            h = self.act_fn(torch.baddbmm(b, h, w))
        return h

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """``(actor output [batch, out_actor], value [batch])``."""
        h = self.trunk(obs)
        return torch.addmm(self.b_actor, h[0], self.w_actor), torch.addmm(self.b_critic, h[1], self.w_critic).squeeze(-1)

    def value(self, obs: Tensor) -> Tensor:
        """Critic output only (still runs the fused trunk)."""
        return torch.addmm(self.b_critic, self.trunk(obs)[1], self.w_critic).squeeze(-1)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a flat observation, evaluated as one :class:`TwinMLP`."""

    discrete: bool

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], activation: str, ortho: bool):
        super().__init__()
        self.net = TwinMLP(obs_dim, tuple(hidden), act_dim, activation, ortho)

    def value(self, obs: Tensor) -> Tensor:
        """V(s), shape ``[batch]``."""
        return self.net.value(obs)

    def actor_features(self, obs: Tensor) -> Tensor:
        """The actor's last hidden activations, ``[batch, width]`` (a method's input features)."""
        return self.net.trunk(obs)[0]


class CategoricalActorCritic(ActorCritic):
    """Discrete actions: the actor outputs logits."""

    discrete = True

    def sample_noise(self, shape: tuple[int, ...], generator: torch.Generator | None = None) -> Tensor:
        """Gumbel noise for ``shape[:-1]`` categorical draws (pre-drawn for a whole rollout at once)."""
        u = torch.rand(shape, generator=generator).clamp_(1e-12, 1.0)
        return torch.log(-torch.log(u))

    def act(self, obs: Tensor, generator: torch.Generator | None = None,
            noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions by Gumbel-max (``noise`` from :meth:`sample_noise`, drawn here if None);
        return ``(action, logp, value)``."""
        logits, value = self.net(obs)
        logp_all = torch.log_softmax(logits, -1)
        if noise is None:
            noise = self.sample_noise(logits.shape, generator)
        action = (logp_all - noise).argmax(-1)
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(logp(action), entropy, value)`` for a batch."""
        logits, value = self.net(obs)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, action.long()[:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, value

    def deterministic(self, obs: Tensor) -> Tensor:
        """The most probable action."""
        return self.net(obs)[0].argmax(-1)


class GaussianActorCritic(ActorCritic):
    """Continuous actions: the actor outputs the mean; log-std is a free parameter per action dim."""

    discrete = False

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...], activation: str, ortho: bool,
                 log_std_init: float = 0.0):
        super().__init__(obs_dim, act_dim, hidden, activation, ortho)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))

    def _logp(self, mean: Tensor, action: Tensor) -> Tensor:
        z = (action - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * _LOG_2PI).sum(-1)

    def act(self, obs: Tensor, generator: torch.Generator | None = None,
            noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Sample ``mean + std * eps`` (``eps = noise``, drawn here if None); return ``(action, logp, value)``."""
        mean, value = self.net(obs)
        eps = torch.randn(mean.shape, generator=generator) if noise is None else noise
        action = mean + self.log_std.exp() * eps
        logp = (-0.5 * eps.pow(2) - self.log_std - 0.5 * _LOG_2PI).sum(-1)
        return action, logp, value

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(logp(action), entropy, value)`` for a batch."""
        mean, value = self.net(obs)
        entropy = (0.5 + 0.5 * _LOG_2PI + self.log_std).sum().expand(mean.shape[0])
        return self._logp(mean, action), entropy, value

    def deterministic(self, obs: Tensor) -> Tensor:
        """The mean action."""
        return self.net(obs)[0]


def build_actor_critic(obs_space, act_space, hidden: tuple[int, ...], activation: str, ortho: bool,
                       log_std_init: float) -> ActorCritic:
    """The actor-critic that fits a Gymnasium ``(observation, action)`` space pair."""
    from gymnasium import spaces

    from ..errors import ConfigError

    if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
        raise ConfigError(f"reflectrl's MLP policies need a flat Box observation space, got {obs_space}")
    obs_dim = int(np.prod(obs_space.shape))
    if isinstance(act_space, spaces.Discrete):
        return CategoricalActorCritic(obs_dim, int(act_space.n), hidden, activation, ortho)
    if isinstance(act_space, spaces.Box) and len(act_space.shape) == 1:
        return GaussianActorCritic(obs_dim, int(act_space.shape[0]), hidden, activation, ortho, log_std_init)
    raise ConfigError(f"unsupported action space {act_space}: reflectrl supports Discrete and 1-D Box")
