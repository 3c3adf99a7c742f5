"""Multi-host export: `save_pretrained` of parameters sharded across two processes (jax.distributed,
gloo CPU collectives, 4 devices each) and `mpa export --distributed` from two processes write the same
files, byte for byte, as one process does."""
import filecmp
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from mpa_jax import models, sharding
from mpa_jax.config import load_config_file
from mpa_jax.sft import run_sft
from mpa_jax.sft.synthetic import tiny_test_config, write_trajectories

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = models.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, tie_word_embeddings=False, scan_layers=True)

CHILD = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    addr, pid, out, ckpt, exp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    from mpa_jax import cli, models, sharding
    from tests.integration.test_multihost_export import CFG
    # mpa export initialises jax.distributed itself
    assert cli.main(["export", "--config", "configs/tiny.py", "--workdir", exp + "-w" + str(pid), "--checkpoint", ckpt,
                     "--out", exp, "--dtype", "float32", "--distributed", "--coordinator", addr,
                     "--num-processes", "2", "--process-id", str(pid)]) == 0
    assert jax.process_count() == 2 and jax.device_count() == 8
    mesh = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 1, "expert": 1})
    params = models.init_params(CFG, jax.random.key(3), mesh)
    assert not params["model"]["embed_tokens"]["weight"].is_fully_addressable  # really spread over both processes
    models.save_pretrained(models.Model(CFG, params), out, dtype="float32", max_shard_bytes=40_000)
    print("DONE", flush=True)
    jax.distributed.shutdown()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_save_and_export_write_the_files_of_one(tmp_path):
    data = write_trajectories(str(tmp_path / "d.jsonl"), 16, 256, seed=4)
    c = tiny_test_config(load_config_file(os.path.join(ROOT, "configs/tiny.py")), steps=1)
    run = run_sft(c, str(tmp_path / "run"), data, progress=False)
    addr = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    two, exp2 = str(tmp_path / "two"), str(tmp_path / "export-two")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, addr, str(i), two, run.checkpoint_dir, exp2], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    # the one-process references, while the children run
    one = models.save_pretrained(models.Model(CFG, models.init_params(CFG, __import__("jax").random.key(3), sharding.make_mesh((1, 8, 1, 1)))),
                                 str(tmp_path / "one"), dtype="float32", max_shard_bytes=40_000)
    from mpa_jax.export import export_checkpoint

    exp1 = export_checkpoint(run.checkpoint_dir, str(tmp_path / "export-one"), dtype="float32")
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and "DONE" in out, err[-3000:]
    for a, b in ((one, two), (exp1, exp2)):
        names = sorted(os.listdir(a))
        assert len([n for n in names if n.endswith(".safetensors")]) >= (2 if a == one else 1)
        assert names == sorted(os.listdir(b))
        _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
        assert not mismatch and not errors, (a, mismatch, errors)
