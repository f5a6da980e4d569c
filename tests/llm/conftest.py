import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from reflectrl.tasks.base import TASKS, register_task  # noqa: E402

from .toytasks import AddTask, GuessTask  # noqa: E402

if "toy-add" not in TASKS:
    register_task("toy-add")(AddTask)
    register_task("toy-guess")(GuessTask)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random-init model directory shared by the LLM tests."""
    from reflectrl.llm.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("tiny") / "model", layers=1, width=32, heads=2, max_positions=128, seed=0)


@pytest.fixture(scope="session")
def tiny_policy(tiny_dir):
    from reflectrl.llm.policy import load_policy

    return load_policy(tiny_dir)
