"""Each trainer learns (Stable-Baselines3-style): PPO and DQN on CartPole reach a return far above a random
policy's (about 22), and GRPO raises a tiny model's accuracy on its one-digit arithmetic problems, all at fixed
seeds (on CPU the runs are deterministic, so these are regression tests of learning itself)."""

from reflectrl.control import PPO, PPOConfig
from reflectrl.control.dqn import DQN, DQNConfig
from reflectrl.control.evaluate import evaluate


def test_ppo_learns_cartpole(tmp_path):
    PPO(PPOConfig(env_id="CartPole-v1", total_timesteps=25_000, run_dir=str(tmp_path / "p"), progress=False,
                  tensorboard=False, seed=1)).learn()
    assert sum(evaluate(tmp_path / "p", 10)) / 10 > 150


def test_dqn_learns_cartpole(tmp_path):
    DQN(DQNConfig(env_id="CartPole-v1", total_timesteps=20_000, learning_starts=1000, train_frequency=4,
                  target_network_frequency=250, exploration_fraction=0.3, learning_rate=1e-3,
                  run_dir=str(tmp_path / "q"), progress=False, tensorboard=False, seed=1)).learn()
    assert sum(evaluate(tmp_path / "q", 10)) / 10 > 150


def test_grpo_raises_a_tiny_models_accuracy(tmp_path):
    """60 GRPO updates on one-digit arithmetic: the sampled accuracy of the last ten updates is clearly above
    that of the first ten (the tiny model starts from a short warm-up)."""
    from reflectrl.algos import config_for_algo
    from reflectrl.llm.grpo import GRPO
    from reflectrl.llm.tiny import init_tiny
    from reflectrl.llm.warmup import WarmupConfig, warmup
    from reflectrl.runlog import read_metrics

    base = init_tiny(tmp_path / "tiny", layers=1, width=32, heads=2, max_positions=128, seed=0)
    options = ("digits=1", "n_train=100", "n_heldout=20")
    warmup(WarmupConfig(model=str(base), task="arith", task_options=options, out=str(tmp_path / "warm"), steps=150,
                        batch_size=32, learning_rate=3e-3, progress=False, max_new_tokens=4))
    cfg = config_for_algo("grpo", task="arith", task_options=options, model=str(tmp_path / "warm"),
                          run_dir=str(tmp_path / "g"), updates=60, prompts_per_update=16, group_size=8,
                          max_new_tokens=4, learning_rate=1e-3, minibatches=2, progress=False, tensorboard=False,
                          save_interval=0, sample_interval=0, reward_workers=0, export_model=False, seed=1)
    GRPO(cfg).learn()
    acc = [r["accuracy"] for r in read_metrics(tmp_path / "g" / "metrics.jsonl")]
    first, last = sum(acc[:10]) / 10, sum(acc[-10:]) / 10
    assert last >= first + 0.04, (first, last)
