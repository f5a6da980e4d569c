"""The one exception type for errors a user can cause and fix (bad env id, bad hyperparameter, ...).

The CLI prints its message as a single line and exits non-zero; library users can catch it.
"""


class ReflectRLError(Exception):
    """A user-facing error whose message says what went wrong and how to fix it."""


class ConfigError(ReflectRLError, ValueError):
    """An impossible or inconsistent hyperparameter."""


class CheckpointError(ReflectRLError):
    """A missing, incomplete or corrupt run directory or checkpoint."""
