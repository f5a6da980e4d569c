"""Importing this module registers reflectrl's estimators and policy losses in verl (:func:`register_with_verl`).

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` whenever a process imports verl, so

    VERL_USE_EXTERNAL_MODULES=reflectrl.integrations.verl_plugin

(in the shell that starts a local Ray instance, or in ``ray_kwargs.ray_init.runtime_env.env_vars`` of the verl
config, which reaches every Ray worker) makes ``reflectrl_grpo``, ``reflectrl_vanilla``, ... known in the trainer
and in every actor worker. See docs/integrations.md.
"""

from __future__ import annotations

from .verl import register_with_verl

REGISTERED = register_with_verl()
