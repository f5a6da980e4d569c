"""EagerAdam is torch.optim.Adam bit for bit (steps, state_dict, resume), and PPO does not import torch._dynamo."""

import subprocess
import sys

import torch

from reflectrl.control.optim import EagerAdam
from reflectrl.control.ppo import clip_grad_norm


def _steps(opt_cls, steps=5, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = opt_cls(model.parameters(), lr=1e-2, eps=1e-5, **kw)
    x = torch.randn(32, 6)
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        (model(x).pow(2).mean() * (i + 1)).backward()
        clip_grad_norm(model.parameters(), 0.5) if opt_cls is EagerAdam else torch.nn.utils.clip_grad_norm_(
            model.parameters(), 0.5)
        opt.step()
    return model, opt


def test_eager_adam_is_adam():
    for kw in ({"fused": True}, {}):
        m1, o1 = _steps(torch.optim.Adam, **kw)
        m2, o2 = _steps(EagerAdam, **kw)
        assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
        s1, s2 = o1.state_dict(), o2.state_dict()
        assert s1["param_groups"] == s2["param_groups"]
        for k in s1["state"]:
            assert all(torch.equal(s1["state"][k][n], s2["state"][k][n]) for n in s1["state"][k])
        o3 = torch.optim.Adam(m2.parameters(), lr=1e-2, eps=1e-5, **kw)
        o3.load_state_dict(s2)  # the state_dicts are interchangeable
        o4 = EagerAdam(m1.parameters(), lr=1e-2, eps=1e-5, **kw)
        o4.load_state_dict(s1)
        assert o4.state_dict()["param_groups"] == s1["param_groups"]


def test_ppo_run_does_not_import_dynamo(tmp_path):
    code = ("import sys; from reflectrl.cli import main; "
            f"main(['train', '--env-id', 'CartPole-v1', '--num-envs', '2', '--num-steps', '16', '--total-timesteps', "
            f"'64', '--save-interval', '1', '--no-progress', '--run-dir', {str(tmp_path / 'r')!r}]); "
            "print('torch._dynamo' in sys.modules, 'reflectrl.llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False False"
