"""Packaging for MPA-JAX.

`kernels/`, `envs/` and `harness/` are mapped into the `mpa_jax` namespace: their bare names are
taken on PyPI (SGLang even depends on `kernels`), so they must never become top-level imports.
"""
from setuptools import find_packages, setup


def _packages() -> list[str]:
    """`mpa_jax.*` from its own folder, plus the three folders mapped into its namespace."""
    pkgs = ["mpa_jax"] + [f"mpa_jax.{p}" for p in find_packages("mpa_jax")]
    for folder in ("kernels", "envs", "harness"):
        pkgs += [f"mpa_jax.{folder}"] + [f"mpa_jax.{folder}.{p}" for p in find_packages(folder)]
    return pkgs


CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore==0.1.86",
    "ml-collections==1.1.0",
    "numpy>=2.0",
    "safetensors>=0.6",
    "tokenizers>=0.22",
    "jinja2>=3.1",
    "rich>=13",
    "tensorboardX>=2.6",
    "httpx>=0.28",
    "matplotlib>=3.8",  # PNG plots of the run report and the experiments
]

setup(
    name="mpa-jax",
    version="0.1.0",
    description="JAX/Flax training stack for mobile planner agents (SFT, CARE RL, harness).",
    python_requires=">=3.11",
    packages=_packages(),
    package_dir={
        "mpa_jax": "mpa_jax",
        "mpa_jax.kernels": "kernels",
        "mpa_jax.envs": "envs",
        "mpa_jax.harness": "harness",
    },
    # the shipped skills, the sink policies and the pre-registered test list; envs has no data files
    package_data={"mpa_jax.harness": ["skills/*.json"], "mpa_jax.harness.security": ["policies/*.json", "policies/*.md"],
                  "mpa_jax.eval": ["preregistered_test.json"]},
    install_requires=CORE,
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.6",
            "hypothesis>=6.100",
            "transformers==5.24.0",
            "torch==2.13.0",
            "mcp>=2.3,<3",
            # the official MCP servers users run (tests/integration/test_harness_mcp_pypi.py); these
            # releases need mcp>=2.3,<3 like the harness. mcp-server-calculator (mcp<2) and
            # mcp-server-sqlite (1.x API: dies at start under mcp 2) are left out: docs/harness.md
            "mcp-server-time==2026.10.19",
            "mcp-server-git==2026.10.19",
            "mcp-server-fetch==2026.10.24",
            "adbutils>=2.8",  # tests/integration/test_adb*.py drive the real adb server through it
            "openai>=1.40",  # tests/integration/test_serve_openai.py: the official client against `mpa serve`
            "openai-agents==0.24.0",  # tests/integration/test_serve_agents.py: the OpenAI Agents SDK against `mpa serve`
            "sglang-router==0.3.2",  # tests/integration/test_fleet_router.py: the real router (a Rust wheel; runs on CPU)
            "tensorboard>=2.16",  # tests read the events files with TensorBoard's own reader (EventAccumulator)
        ],
        "harness": ["mcp>=2.3,<3"],
        "serve": ["fastapi>=0.115", "uvicorn>=0.30"],
        "cuda": ["jax[cuda12]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
        "adb": ["adbutils>=2.8"],
        # the agentdojo env kind (docs/benchmark.md); bfcl-eval cannot be an extra: it is installed --no-deps
        # (`make install-bench`, part of `make test`)
        "agentdojo": ["agentdojo==0.1.35"],
        # bench/rl_step.py: the TRL GRPOTrainer baseline (torch CPU)
        "bench": ["trl==1.16.0", "datasets>=3", "transformers==5.24.0", "torch==2.13.0"],
    },
    entry_points={"console_scripts": ["mpa=mpa_jax.cli:entry"]},
)
