"""``torch.optim.Adam`` for trainers that never run under ``torch.compile``, without importing it.

Every ``torch.optim.Optimizer`` wraps ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` in ``torch._disable_dynamo``, and ``step`` in a guard that calls
``torch._dynamo.graph_break()``: wrappers that matter only while TorchDynamo traces the code, but whose
first call imports ``torch._dynamo`` (sympy, the FX and distributed stacks), seconds of CPU time, more than
``import torch`` itself, at the start of every process that builds an optimizer. :class:`EagerAdam`
calls the functions under those wrappers (``__wrapped__``) while ``torch._dynamo`` has not been imported,
and torch's own methods once it has (so under ``torch.compile`` it is ``torch.optim.Adam``): the same
kernels, state, ``state_dict`` format, hooks and profiler ranges, bit for bit the same updates.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

_DYNAMO = "torch._dynamo"


def _eager(fn: Any) -> Any:
    """``fn`` without torch's dynamo wrappers while ``torch._dynamo`` is not imported; ``fn`` itself once it is."""
    return fn if _DYNAMO in sys.modules else inspect.unwrap(fn)


class EagerAdam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, state and results) that does not import ``torch._dynamo``."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _eager(torch.optim.Adam.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _eager(torch.optim.Adam.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _eager(torch.optim.Adam.state_dict)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _eager(torch.optim.Adam.load_state_dict)(self, state_dict)

    def step(self, closure: Any = None) -> Any:
        if _DYNAMO in sys.modules:
            return inspect.unwrap(torch.optim.Adam.step, stop=lambda f: not hasattr(f, "hooked"))(self, closure)
        # what Adam.step's grad guard does (torch/optim/optimizer.py, _use_grad_for_differentiable), minus
        # its graph breaks, which only tracing sees; the step hooks and profiler range wrap this method
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return inspect.unwrap(torch.optim.Adam.step)(self, closure)
        finally:
            torch.set_grad_enabled(prev)
