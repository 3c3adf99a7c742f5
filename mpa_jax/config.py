"""Loading `configs/<name>.py` experiment configs and applying `--config.a.b=value` overrides."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
from typing import Any, Sequence

import ml_collections


from mpa_jax.errors import ConfigError  # noqa: F401  (re-exported: `from mpa_jax.config import ConfigError`)


# The config every command uses when `--config` is not given (a name in `configs_dir()`).
DEFAULT_CONFIG = "tiny"


def configs_dir() -> str:
    """The packaged configs: `configs/` beside the `mpa_jax` package, i.e. the repository root of the
    (editable) install, found from this file rather than the working directory, so names resolve
    from anywhere."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def config_names() -> list[str]:
    """The names `--config NAME` accepts (configs/*.py with a get_config)."""
    d = configs_dir()
    if not os.path.isdir(d):
        return []
    return sorted(f[:-3] for f in os.listdir(d) if f.endswith(".py") and not f.startswith("_"))


def resolve_config_path(name_or_path: str) -> str:
    """A config file from a path (as given, else relative to the repository root, so the documented
    `configs/tiny.py` works outside it) or a name (`tiny` or `tiny.py` -> `configs_dir()/tiny.py`)."""
    text = os.path.expanduser(str(name_or_path))
    if os.path.isfile(text):
        return text
    root = os.path.dirname(configs_dir())
    candidates = []
    if not os.path.isabs(text):
        if os.sep not in text and "/" not in text:
            candidates.append(os.path.join(configs_dir(), text if text.endswith(".py") else text + ".py"))
        candidates.append(os.path.join(root, text))
    for cand in candidates:
        if os.path.isfile(cand):
            return cand
    names = ", ".join(config_names()) or f"none found in {configs_dir()}"
    raise ConfigError(f"config not found: {name_or_path} (give a file path or a config name: {names})")


def load_config_file(path: str) -> ml_collections.ConfigDict:
    """Import the config file `path` (a path or a name, see `resolve_config_path`) and return its
    `get_config()`."""
    path = resolve_config_path(path)
    spec = importlib.util.spec_from_file_location(f"_mpa_config_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {path} has no get_config()")
    config = module.get_config()
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config() in {path} must return an ml_collections.ConfigDict")
    return config


def load_config(path: str, overrides: Sequence[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
    """The config of a run: `load_config_file(path)`, the `--config.a.b=v` overrides applied in order, then
    `validate`d, so a bad value is one error here, before any stage starts."""
    config = load_config_file(path)
    for key, value in overrides:
        apply_override(config, key, value)
    validate(config)
    return config


# The values a knob may take, checked once when a config is loaded (not again by each stage that reads it).
CHOICES = {"serve.batcher": ("auto", "slots", "call"), "rollout.compute_dtype": ("", "float32", "bfloat16")}
# Knobs whose code is gone but whose registered value a pre-registered config's hash covers (docs/preregistered.md):
# configs/rl_lift.py keeps them at these values and nothing reads them, so any other value is refused rather than
# silently ignored. The focus pool (`rl.select_pool*`, one experiment's lever that did not help) went in issue 55.
RETIRED = {"rl.select_pool": 0, "rl.select_pool_patience": 3, "rl.select_pool_groups": 48}


def validate(config: ml_collections.ConfigDict) -> None:
    """Check the rules one config value cannot break on its own reading: a `name`, `CHOICES`, `RETIRED`, the
    prefill chunk and the context format. Raises ConfigError naming the key."""
    if not str(config.get("name") or "").strip():
        raise ConfigError("the config has no `name` (set c.name; the run directory defaults to runs/<name>)")
    for key, allowed in CHOICES.items():
        section, leaf = key.split(".")
        if section in config and leaf in config[section] and config[section][leaf] not in allowed:
            raise ConfigError(f"config.{key} must be one of {', '.join(map(str, allowed))}, got {config[section][leaf]!r}")
    for key, value in RETIRED.items():
        section, leaf = key.split(".")
        if section in config and leaf in config[section] and config[section][leaf] != value:
            raise ConfigError(f"config.{key} was removed (it did nothing since issue 55); it may only keep its registered value {value!r}")
    if "rollout" in config:
        if int(config.rollout.prefill_chunk) < 1:
            raise ConfigError(f"config.rollout.prefill_chunk must be >= 1, got {config.rollout.prefill_chunk}")
    if "memory" in config and not 0.0 <= float(config.memory.paraphrase) <= 1.0:
        raise ConfigError(f"config.memory.paraphrase must be in [0, 1], got {config.memory.paraphrase}")
    if "envs" in config and "agentdojo" in config.envs:
        from mpa_jax.envs.agentdojo.env import check_attack  # imports no agentdojo

        try:
            check_attack(config.envs.agentdojo.attack, config.envs.agentdojo.injection_tasks)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if "context" in config:
        from mpa_jax.envs.context import ContextFormat

        try:
            ContextFormat.from_config(config)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _parse_value(key: str, text: str, current: Any) -> Any:
    """Parse `text` to the type of the field's current value, as ml_collections config flags do."""
    if isinstance(current, bool):
        low = text.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ConfigError(f"override --config.{key}: expected a bool, got {text!r}")
    if isinstance(current, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"override --config.{key}: expected an int, got {text!r}") from None
    if isinstance(current, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"override --config.{key}: expected a float, got {text!r}") from None
    if isinstance(current, str):
        return text
    if isinstance(current, (tuple, list)):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(f"override --config.{key}: expected a {type(current).__name__}, got {text!r}") from None
        if not isinstance(value, (tuple, list)):
            raise ConfigError(f"override --config.{key}: expected a {type(current).__name__}, got {text!r}")
        return type(current)(value)
    if current is None:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    raise ConfigError(f"override --config.{key}: cannot override a field of type {type(current).__name__}")


def apply_override(config: ml_collections.ConfigDict, key: str, text: str) -> None:
    """Set `config.<key>` from the string `text`, keeping the field's type; unknown keys raise."""
    parts = key.split(".")
    node: Any = config
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ConfigError(f"unknown config key: {'.'.join(parts[: i + 1])}")
        node = node[part]
    leaf = parts[-1]
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
        raise ConfigError(f"unknown config key: {key}")
    if isinstance(node[leaf], ml_collections.ConfigDict):
        raise ConfigError(f"config key {key} is a section; override one of its fields")
    value = _parse_value(key, text, node[leaf])
    try:
        node[leaf] = value
    except TypeError as e:
        raise ConfigError(f"override --config.{key}: {e}") from None


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separate `--config.a.b=v` / `--config.a.b v` overrides from the other arguments."""
    rest: list[str] = []
    overrides: list[tuple[str, str]] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            body = arg[len("--config."):]
            if "=" in body:
                key, value = body.split("=", 1)
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"override {arg} has no value")
                key, value = body, argv[i + 1]
                i += 1
            overrides.append((key, value))
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def save_config(config: ml_collections.ConfigDict, workdir: str) -> str:
    """Write the resolved config into the run directory as JSON (and a readable .txt)."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True, default=str)
    with open(os.path.join(workdir, "config.txt"), "w", encoding="utf-8") as f:
        f.write(str(config))
    return path
