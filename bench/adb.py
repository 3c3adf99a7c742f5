"""ADB device env throughput: oracle episodes per second and mean command latency through the REAL adb
server (Debian `adb`) to the emulated device, which runs in its own process (`mpa device emulate`).

    .venv/bin/python bench/adb.py [--episodes 60]

Side by side in one run: the same oracle episodes in the in-process sandbox, and a bare `echo` round
trip (the floor of one adb shell command: adb server + adbd wire protocol + loopback TCP).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mpa_jax.envs import load_tasks, make_env, run_oracle_episode  # noqa: E402
from mpa_jax.envs.adb.env import AdbEnv  # noqa: E402
from mpa_jax.envs.adb.server import AdbServer, free_port  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=60)
    ap.add_argument("--echoes", type=int, default=200)
    args = ap.parse_args()
    tasks = load_tasks("test")
    random.Random(0).shuffle(tasks)
    tasks = tasks[:args.episodes]
    port = free_port()
    emu = subprocess.Popen([sys.executable, "-c", "import sys; from mpa_jax.cli import main; sys.exit(main())",
                            "device", "emulate", "--port", str(port), "--workdir", os.path.join(ROOT, "runs", "bench-adb")],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        emu.stdout.readline()
        with AdbServer() as srv:
            serial = f"127.0.0.1:{port}"
            srv.connect(serial)
            env = AdbEnv(serial, adb_port=srv.port)
            env.reset(tasks[0])
            lat = []
            for _ in range(args.echoes):
                t = time.perf_counter()
                env.shell(["echo", "x"])
                lat.append(time.perf_counter() - t)
            env.commands, env.command_s = 0, 0.0
            t = time.perf_counter()
            ok = sum(run_oracle_episode(env, task, seed=1).verification.success for task in tasks)
            adb_s = time.perf_counter() - t
            n_cmd, cmd_s = env.commands, env.command_s
        sandbox = make_env("sandbox")
        t = time.perf_counter()
        ok_sb = sum(run_oracle_episode(sandbox, task, seed=1).verification.success for task in tasks)
        sb_s = time.perf_counter() - t
    finally:
        emu.terminate()
        emu.wait(timeout=10)
    n = len(tasks)
    print(f"adb shell echo round trip: median {statistics.median(lat) * 1e3:.2f} ms, mean {statistics.mean(lat) * 1e3:.2f} ms"
          f" ({args.echoes} commands)")
    print(f"adb device env: {n} oracle episodes in {adb_s:.2f} s = {n / adb_s:.2f} episodes/s, success {ok}/{n};"
          f" {n_cmd} adb commands ({n_cmd / n:.1f}/episode), mean command latency {cmd_s / n_cmd * 1e3:.2f} ms")
    print(f"sandbox (in process): {n / sb_s:.1f} episodes/s, success {ok_sb}/{n}; device/sandbox time {adb_s / sb_s:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
