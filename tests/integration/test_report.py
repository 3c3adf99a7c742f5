"""The run report (mpa_jax.report): rendered in headless Chromium (Debian's `chromium`, installed by
`make test`); the screenshot and the DOM must show the plots and the tables."""
import io
import json
import os
import re
import shutil
import subprocess

import numpy as np

from mpa_jax.data import CurationConfig, curate
from mpa_jax.envs import Action, Step, Trajectory, Verification
from mpa_jax.report import write_report


def _eval_json(path, total, out_only):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cost = {"input_tokens": total - out_only - 0.1, "output_tokens": out_only, "tool_calls": 0.05, "device_seconds": 0.05, "total": total}
    json.dump({"harness": {"off": {"overall": {"cost_per_1k_tasks": cost}}}}, open(path, "w"))


def _summary(workdir):
    stages = []
    for i, (name, succ) in enumerate([("untrained", 0.0), ("SFT", 0.3), ("round 1", 0.45), ("round 2", 0.6)]):
        ej = os.path.join(workdir, "eval", str(i), "eval.json")
        _eval_json(ej, 1.0 - 0.1 * i, 0.2)
        stages.append({"name": name, "success": succ, "partial_score": succ + 0.1,
                       "by_category": {"Tool Use": succ + 0.1, "Memory": succ, "Skills": succ / 2, "Sub-agent": succ / 3},
                       "mean_output_tokens": 120 - 10 * i, "mean_tool_calls": 2.0, "cost_per_1k_tasks": 1.0 - 0.1 * i,
                       "cost_per_1k_tasks_output_only": 0.2, "weight_version": f"w{i}", "harness_version": "0.1.0" if i > 1 else "none",
                       "eval_json": ej})
    trajs = [Trajectory(task_id=f"t{i}", tokens=[1] * (10 + i), loss_mask=[1] * (10 + i), logprobs=[0.0] * (10 + i),
                        steps=[Step(Action.message("ok"))], verification=Verification(success=True, score=1.0),
                        provenance={"domain": "media", "category": "tool_use", "difficulty": 1, "planner": "oracle"},
                        messages=[{"role": "user", "content": str(i)}]) for i in range(5)]
    sheet = curate(trajs, CurationConfig()).write(os.path.join(workdir, "data", "r0", "sft.jsonl"), name="round 0")
    json.dump({"care": {"step": [0, 1, 2], "success": [0.2, 0.4, 0.5], "output_tokens": [100, 80, 70]},
               "vanilla": {"step": [0, 1, 2], "success": [0.2, 0.4, 0.5], "output_tokens": [100, 110, 120]}},
              open(os.path.join(workdir, "care_vs_vanilla.json"), "w"))
    return {"config": "unit", "split": "test", "heldout_tasks": 32, "stages": stages,
            "skipped": [{"stage": "r1/rl", "reason": "the CARE RL trainer is not in this build"}],
            "harness": [{"round": "r1", "version": "0.1.0", "changes": ["normaliser: unit names for convert_units"], "failures": 7,
                         "clusters": [{"tool": "convert_units", "error": "UNSUPPORTED_VALUE", "count": 5}]}],
            "datasheets": [sheet], "training_losses": {"r0/sft": [6.0, 4.0, 3.0], "r1/refresh": [3.0, 2.5]}}


def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian's chromium is needed for the report test (`make test` installs it: apt-get install -y chromium)"
    return exe


def test_report_renders_in_headless_chromium(tmp_path):
    from PIL import Image

    workdir = str(tmp_path)
    path = write_report(workdir, _summary(workdir))
    text = open(path, encoding="utf-8").read()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained, no server
    # a copy with a probe that records, after load, which images actually decoded
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", "<script>window.addEventListener('load',()=>{for(const i of document.images)"
                                  "i.setAttribute('data-decoded',i.naturalWidth>0?'yes':'no')});</script></body>"))
    exe = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]
    dom = subprocess.run([exe, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    imgs = re.findall(r'<img class="plot"[^>]*>', dom)
    assert len(imgs) == 5, dom[:2000]  # success, categories, length, CARE vs vanilla, cost
    assert all('src="data:image/png;base64,' in i and 'data-decoded="yes"' in i for i in imgs)
    for cls in ("headline", "harness", "cost", "skipped", "datasheet", "datasheet-cats"):
        assert f'<table class="{cls}">' in dom, cls
    assert "round 2" in dom and "60.0%" in dom and "normaliser: unit names" in dom and "not in this build" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", "--window-size=1200,4000", probe.as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")
    assert img.size == (1200, 4000)
    px = np.asarray(img).astype(int).reshape(-1, 3)
    # matplotlib's first colour (#1f77b4) is on every plot; the table headers are #eeeeff
    blue = int((np.abs(px - [31, 119, 180]).max(axis=1) < 25).sum())
    header = int((px == [238, 238, 255]).all(axis=1).sum())
    assert blue > 2000, blue
    assert header > 500, header
    assert len(np.unique(px[::97], axis=0)) > 50  # not a blank page
