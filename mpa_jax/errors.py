"""The errors a user sees as one line: every command raises these, `mpa_jax/cli.py` catches them.

`UserError`: bad input to a command (exit 2 with its message). `ConfigError`: a config file, an override
or a value that breaks a rule checked when the config is loaded (`mpa_jax.config.validate`). No jax, no
imports from the rest of the package, so any module may raise them.
"""
from __future__ import annotations


class UserError(Exception):
    """Raised by a command for bad user input; the CLI prints its one-line message and exits 2."""


class ConfigError(ValueError):
    """A config file, override or value is wrong; the message names it."""
