"""Speed yardstick: a re-implementation of the training loop of CleanRL's ``ppo.py``.

This module is used only to measure how fast a reference PPO runs on a given
machine, so that the speed of ``reflectrl``'s own PPO can be compared with it.
It is not part of the library.

It re-implements, in our own code, the algorithm and the per-iteration work of
the discrete-action PPO script ``ppo.py`` from CleanRL:

    S. Huang, R. F. J. Dossa, C. Ye, J. Braga, D. Chakraborty, K. Mehta and
    J. G. M. Araújo. "CleanRL: High-quality Single-file Implementations of Deep
    Reinforcement Learning Algorithms". Journal of Machine Learning Research
    23(274):1-18, 2022.  https://github.com/vwxyzjn/cleanrl

Everything that determines the cost of CleanRL's loop is kept as it is, its
inefficiencies included: a fresh ``torch.distributions.Categorical`` on every
call, ``torch.Tensor(...).to(device)`` conversions of each step's outputs,
``get_action_and_value`` (with an actor *and* a critic forward pass) in the
update, flattening of the rollout buffers, advantage normalisation per
minibatch, clipped value loss, linear learning-rate annealing, minibatch indices
from ``np.random.shuffle``, ``clip_grad_norm_``, Adam with ``eps=1e-5``,
orthogonal initialisation (gain sqrt(2) for hidden layers, 0.01 for the actor
output, 1.0 for the critic output) and separate 64x64 tanh actor and critic.
The hyperparameters are CleanRL's defaults (8 envs x 128 steps, 4 epochs,
4 minibatches, lr 2.5e-4 annealed, gamma 0.99, GAE lambda 0.95, clip 0.2,
entropy 0.01, value 0.5, max grad norm 0.5, no target KL).

Changes for Gymnasium 1.x (CleanRL's script targets gym/gymnasium 0.26-0.29):

* The vector env is ``gym.vector.SyncVectorEnv(..., autoreset_mode=
  gym.vector.AutoresetMode.SAME_STEP)``, which restores the same-step autoreset
  that CleanRL's loop was written for (the observation returned with a done
  flag is already the first observation of the next episode).  As in CleanRL,
  truncation is treated like termination: ``next_done = terminations |
  truncations``.
* Finished episodes' statistics are read from ``info["final_info"]``, which in
  Gymnasium 1.x is a dict of arrays with ``"_episode"``-style boolean masks
  rather than a per-env list of dicts.
* The default env is ``LunarLander-v3`` (``-v2`` is gone from Gymnasium 1.x).

Other differences, none of which touches the training work: by default there
is no TensorBoard writer, no wandb, no video capture and no per-episode
``print``; the scalars CleanRL logs every iteration are still computed
(including their ``.item()`` calls) and kept in a small list.  With
``--tensorboard DIR`` (``run(tensorboard_dir=DIR)``) it also writes CleanRL's
TensorBoard logging to DIR: the hyperparameter table as text, the return and
length of every finished episode, and the nine scalars of each iteration (for
measuring the whole process as CleanRL's script runs it; see
``benchmarks/ppo_process_speed.py``).  A few ``time.perf_counter`` calls split
the wall time into env stepping, rollout inference and update.

Usage::

    python benchmarks/cleanrl_ppo.py --total-timesteps 50000
"""

from __future__ import annotations

import argparse
import json
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

# CleanRL ppo.py defaults (besides those exposed by ``run``).
LEARNING_RATE = 2.5e-4
ANNEAL_LR = True
GAMMA = 0.99
GAE_LAMBDA = 0.95
NUM_MINIBATCHES = 4
UPDATE_EPOCHS = 4
NORM_ADV = True
CLIP_COEF = 0.2
CLIP_VLOSS = True
ENT_COEF = 0.01
VF_COEF = 0.5
MAX_GRAD_NORM = 0.5
TARGET_KL = None


def _env_factory(env_id: str):
    def make():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return make


def _init_layer(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate 64x64 tanh actor and critic, as in CleanRL's ppo.py."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            _init_layer(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            _init_layer(nn.Linear(64, 64)),
            nn.Tanh(),
            _init_layer(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            _init_layer(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            _init_layer(nn.Linear(64, 64)),
            nn.Tanh(),
            _init_layer(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        dist = Categorical(logits=logits)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)


def run(
    total_timesteps: int = 100_000,
    seed: int = 1,
    env_id: str = "LunarLander-v3",
    num_envs: int = 8,
    num_steps: int = 128,
    threads: int = 1,
    tensorboard_dir: str | None = None,
) -> dict:
    """Train CleanRL-style PPO and return the step count, speed and time breakdown; with
    ``tensorboard_dir``, also write CleanRL's TensorBoard logging there."""
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // NUM_MINIBATCHES
    num_iterations = total_timesteps // batch_size

    torch.set_num_threads(threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cpu")

    writer = None
    if tensorboard_dir is not None:  # as CleanRL's ppo.py: a SummaryWriter with the hyperparameters as text
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(tensorboard_dir)
        hparams = {"env_id": env_id, "seed": seed, "total_timesteps": total_timesteps, "num_envs": num_envs,
                   "num_steps": num_steps, "learning_rate": LEARNING_RATE, "anneal_lr": ANNEAL_LR, "gamma": GAMMA,
                   "gae_lambda": GAE_LAMBDA, "num_minibatches": NUM_MINIBATCHES, "update_epochs": UPDATE_EPOCHS,
                   "norm_adv": NORM_ADV, "clip_coef": CLIP_COEF, "clip_vloss": CLIP_VLOSS, "ent_coef": ENT_COEF,
                   "vf_coef": VF_COEF, "max_grad_norm": MAX_GRAD_NORM, "target_kl": TARGET_KL,
                   "batch_size": batch_size, "minibatch_size": minibatch_size}
        writer.add_text("hyperparameters",
                        "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in hparams.items()))

    envs = gym.vector.SyncVectorEnv(
        [_env_factory(env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete actions"
    for i, sub_env in enumerate(envs.envs):
        sub_env.action_space.seed(seed + i)
    obs_shape = envs.single_observation_space.shape
    act_shape = envs.single_action_space.shape

    agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=LEARNING_RATE, eps=1e-5)

    # Rollout storage.
    obs = torch.zeros((num_steps, num_envs) + obs_shape).to(device)
    actions = torch.zeros((num_steps, num_envs) + act_shape).to(device)
    logprobs = torch.zeros((num_steps, num_envs)).to(device)
    rewards = torch.zeros((num_steps, num_envs)).to(device)
    dones = torch.zeros((num_steps, num_envs)).to(device)
    values = torch.zeros((num_steps, num_envs)).to(device)

    episodic_returns: list[float] = []
    logged: list[dict] = []
    t_env = t_inf = t_upd = 0.0
    clock = time.perf_counter

    global_step = 0
    start_time = clock()
    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(num_envs).to(device)

    for iteration in range(1, num_iterations + 1):
        if ANNEAL_LR:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * LEARNING_RATE

        for step in range(num_steps):
            global_step += num_envs
            obs[step] = next_obs
            dones[step] = next_done

            t0 = clock()
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            t1 = clock()
            actions[step] = action
            logprobs[step] = logprob

            t2 = clock()
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
            t3 = clock()
            t_inf += t1 - t0
            t_env += t3 - t2

            # Gymnasium 1.x, same-step autoreset: stats of the episodes that just
            # ended are arrays under final_info, masked by "_episode".
            if "final_info" in infos:
                final = infos["final_info"]
                if "episode" in final:
                    mask = final["_episode"]
                    episodic_returns.extend(float(r) for r in final["episode"]["r"][mask])
                    if writer is not None:
                        for r, n in zip(final["episode"]["r"][mask], final["episode"]["l"][mask]):
                            writer.add_scalar("charts/episodic_return", r, global_step)
                            writer.add_scalar("charts/episodic_length", n, global_step)

        t4 = clock()
        # Generalised advantage estimation.
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + GAMMA * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + GAMMA * GAE_LAMBDA * nextnonterminal * lastgaelam
            returns = advantages + values

        # Flatten the batch.
        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + act_shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimise the policy and value networks.
        b_inds = np.arange(batch_size)
        clipfracs = []
        for _epoch in range(UPDATE_EPOCHS):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start : start + minibatch_size]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions.long()[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > CLIP_COEF).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if NORM_ADV:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Clipped surrogate objective.
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - CLIP_COEF, 1 + CLIP_COEF)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss, clipped around the rollout's values.
                newvalue = newvalue.view(-1)
                if CLIP_VLOSS:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -CLIP_COEF, CLIP_COEF
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - ENT_COEF * entropy_loss + v_loss * VF_COEF

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
                optimizer.step()

            if TARGET_KL is not None and approx_kl > TARGET_KL:
                break
        t_upd += clock() - t4

        # The scalars CleanRL writes to TensorBoard each iteration.
        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
        logged.append(
            {
                "learning_rate": optimizer.param_groups[0]["lr"],
                "value_loss": v_loss.item(),
                "policy_loss": pg_loss.item(),
                "entropy": entropy_loss.item(),
                "old_approx_kl": old_approx_kl.item(),
                "approx_kl": approx_kl.item(),
                "clipfrac": np.mean(clipfracs),
                "explained_variance": explained_var,
                "SPS": int(global_step / (clock() - start_time)),
            }
        )
        if writer is not None:
            for key, value in logged[-1].items():
                writer.add_scalar(("charts/" if key in ("learning_rate", "SPS") else "losses/") + key, value, global_step)

    total = clock() - start_time
    envs.close()
    if writer is not None:
        writer.close()
    return {
        "global_step": global_step,
        "sps": global_step / total,
        "time/env": t_env,
        "time/inference": t_inf,
        "time/update": t_upd,
        "time/total": total,
        "episodic_returns": episodic_returns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env-id", type=str, default="LunarLander-v3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tensorboard", type=str, default=None, metavar="DIR",
                        help="also write CleanRL's TensorBoard logging to DIR")
    args = parser.parse_args()

    result = run(
        total_timesteps=args.total_timesteps,
        seed=args.seed,
        env_id=args.env_id,
        threads=args.threads,
        tensorboard_dir=args.tensorboard,
    )
    returns = result.pop("episodic_returns")
    result["episodes"] = len(returns)
    result["mean_return_last20"] = float(np.mean(returns[-20:])) if returns else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
