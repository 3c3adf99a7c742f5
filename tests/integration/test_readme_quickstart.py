"""The README's quickstart commands run, at micro size, so the guide cannot rot.

The README's fenced blocks tagged `quickstart` (```` ```bash quickstart ````) hold the commands a new user
types; blocks tagged `quickstart-serve` are a server (bash: started in the background) and its client
(python: run once the server is up). The test runs every one of them as written, in README order, with
only these changes, which make them small enough for CI and keep them in a temporary directory:

- `--config micro` is added (configs/micro.py: the same code paths as the tiny default, a 32-wide model);
- `starter` as a checkpoint becomes a micro checkpoint the test makes first with `mpa sft --config micro
  --max-steps 1 --export` (the shipped starter has another shape and takes minutes per step here);
- budgets shrink: `--max-steps N` -> 1, `--max-tasks N` -> 2; `runs/...` -> a temporary directory;
  `--port 8000` -> a free port (and the client's URL with it).

`mpa loop` (the README's last job) is not tagged: tests/integration/test_loop.py runs it (`make demo` is that command on configs/tiny.py).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
FENCE = re.compile(r"^```(\w+)[ \t]+(quickstart(?:-serve)?)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def quickstart_blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, tag, body) of every fenced block tagged quickstart or quickstart-serve, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(text)]


def shell_commands(body: str) -> list[list[str]]:
    """The `mpa ...` commands of a bash block (comments dropped, backslash continuations joined)."""
    joined = re.sub(r"\\\n", " ", body)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "mpa", f"a quickstart line that is not an mpa command: {line!r}"
            out.append(words)
    return out


def micro(words: list[str], tmp: str, start: str, port: int) -> list[str]:
    """A README command made small (see the module docstring)."""
    args = list(words[1:])
    sizes = {"--max-steps": "1", "--max-tasks": "2", "--port": str(port)}
    for i, w in enumerate(args):
        prev = args[i - 1] if i else ""
        if prev in sizes:
            args[i] = sizes[prev]
        elif prev in ("--checkpoint", "--init") and w == "starter":
            args[i] = start
        elif w.startswith("runs/"):
            args[i] = os.path.join(tmp, w)
    if "--config" not in args:
        args += ["--config", "micro"]
    return [sys.executable, "-m", "mpa_jax.cli", *args]


def _env(cache: str) -> dict[str, str]:
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", MPA_HUGE_PAGES="0",
                JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def _run(cmd: list[str], env: dict[str, str], cwd: str) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{shlex.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_has_a_tagged_quickstart_per_job():
    """The blocks this test runs exist and cover serving, evaluation, SFT from a checkpoint and RL."""
    blocks = quickstart_blocks(open(README, encoding="utf-8").read())
    commands = [w[1] for lang, _, body in blocks if lang == "bash" for w in shell_commands(body)]
    assert {"serve", "eval", "sft", "rl"} <= set(commands), commands
    assert any(lang == "python" and tag == "quickstart-serve" for lang, tag, _ in blocks)


def test_readme_maps_every_doc_and_links_only_existing_ones():
    """The README's map of the docs lists every page in docs/, and every docs/ link in it exists."""
    text = open(README, encoding="utf-8").read()
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)\)", text))
    pages = {f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md")}
    assert pages <= linked, f"docs missing from the README's map: {sorted(pages - linked)}"
    assert linked <= pages, f"README links to docs that do not exist: {sorted(linked - pages)}"


def test_readme_quickstart_runs_at_micro_size(tmp_path, tmp_path_factory):
    cache = str(tmp_path_factory.getbasetemp() / "mpa-jax-compile-cache")  # shared with the eval and loop tests
    env, tmp, cwd = _env(cache), str(tmp_path), str(tmp_path)  # commands run outside the repository, as a user's would
    blocks = quickstart_blocks(open(README, encoding="utf-8").read())
    _run([sys.executable, "-m", "mpa_jax.cli", "sft", "--config", "micro", "--max-steps", "1", "--export",
          "--workdir", os.path.join(tmp, "start")], env, cwd)
    start = os.path.join(tmp, "start", "hf")
    port = _free_port()
    server = None
    try:
        for lang, tag, body in blocks:
            if lang == "bash":
                for words in shell_commands(body):
                    cmd = micro(words, tmp, start, port)
                    if tag == "quickstart-serve":
                        server = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                        for line in server.stdout:  # the server says where it listens once it does
                            if line.startswith("mpa serve: http://"):
                                break
                        else:
                            pytest.fail(f"{shlex.join(cmd)} exited ({server.wait()}) without serving")
                    else:
                        _run(cmd, env, cwd)
            elif lang == "python":
                assert server is not None, "a client block comes after its server block"
                code = body.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                out = _run([sys.executable, "-c", code], env, cwd)
                assert out.strip(), "the client printed nothing"
                server.send_signal(signal.SIGINT)
                server.wait(timeout=60)
                server = None
    finally:
        if server is not None:
            server.kill()
            server.wait()
    assert os.path.isdir(os.path.join(tmp, "runs"))  # the commands wrote under the mapped runs/
