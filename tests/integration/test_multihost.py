"""Two processes (jax.distributed, gloo CPU collectives, 4 devices each) train exactly like one process."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mpa_jax.config import load_config_file
from mpa_jax.sft import run_sft
from mpa_jax.sft.synthetic import tiny_test_config, write_trajectories

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CHILD = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                               local_device_ids=list(range(4)))
    from mpa_jax.config import load_config_file
    from mpa_jax.sft import run_sft
    from mpa_jax.sft.synthetic import tiny_test_config
    c = tiny_test_config(load_config_file(sys.argv[3]), steps={steps})
    c.checkpoint.every = 2
    assert jax.device_count() == 8 and jax.local_device_count() == 4
    r = run_sft(c, sys.argv[4], sys.argv[5], progress=False)
    print("RESULT " + json.dumps({{"losses": r.losses, "rows": r.local_rows, "process": jax.process_index()}}), flush=True)
    jax.distributed.shutdown()
""").format(steps=STEPS)


def test_two_processes_give_the_losses_of_one(tmp_path):
    data = write_trajectories(str(tmp_path / "d.jsonl"), 64, 256, seed=21)
    config = os.path.join(ROOT, "configs/tiny.py")
    addr = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    run_dir = str(tmp_path / "two")
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, addr, str(i), config, run_dir, data], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    # the single-process reference (8 devices in this process) runs while the children start up
    ref = run_sft(tiny_test_config(load_config_file(config), steps=STEPS), str(tmp_path / "one"), data, progress=False)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert line, err[-3000:]
        results.append(json.loads(line[0][7:]))
    assert len(ref.losses) == STEPS
    for r in results:
        np.testing.assert_allclose(r["losses"], ref.losses, rtol=1e-5)
    # each process read only its own half of the batch rows
    rows = sorted(results, key=lambda r: r["process"])
    assert rows[0]["rows"] and rows[1]["rows"]
    assert not set(rows[0]["rows"]) & set(rows[1]["rows"])
    assert sorted(rows[0]["rows"] + rows[1]["rows"]) == list(range(8))
    # both processes wrote one checkpoint together
    steps = sorted(int(d) for d in os.listdir(os.path.join(run_dir, "checkpoints")) if d.isdigit())
    assert steps[-1] == STEPS
