"""ltm.bench.levers through gpu/levers_bench.py on the CPU (--tiny): the bookkeeping a GPU call relies on, so that a broken
script shows here rather than on the lent GPU. What it measures on a CPU means nothing."""
import json
import subprocess
import sys
from pathlib import Path

from ltm.bench import gpt2_baseline

ROOT = Path(__file__).resolve().parents[2]


def test_the_nanogpt_loop_follows_the_params_size_and_levers_get_verdicts(tmp_path):
    out = tmp_path / "levers.json"
    done = subprocess.run([sys.executable, str(ROOT / "gpu" / "levers_bench.py"), str(out), "--tiny",
                           "--parts", "baseline,ablate,ours", "--set", "model.d_model=96",
                           "--set", "ablate.switches=[train.opt.fp8=all,train.opt.compile_mode=default]"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    # the plain loop at the width asked for (tiny: vocabulary 2048, 2 layers, 2 heads)
    plain = gpt2_baseline.GPT(vocab=2048, d=96, n_layers=2, n_heads=2, max_len=512)
    expected = sum(p.numel() for p in plain.parameters()) - plain.pos.weight.numel()
    assert record["baseline"]["params"] == expected and record["baseline"]["tokens_per_s"] > 0
    rows = {row["switch"]: row for row in record["ablate"]["rows"]}
    # float8 on a CPU: a FAIL row with the one-line reason, and the protocol goes on
    assert rows["train.opt.fp8=all"]["verdict"] == "FAIL"
    assert rows["train.opt.fp8=all"]["note"].startswith("ParamsError: train.opt.fp8: needs a CUDA GPU")
    # compiling keeps the maths: the loss within the exact tolerance (a FAIL otherwise); the
    # verdict on speed is the real clock's
    compiled = rows["train.opt.compile_mode=default"]
    assert compiled["kind"] == "exact" and abs(compiled["delta_val_loss"]) <= compiled["tolerance"]
    assert compiled["verdict"] != "FAIL" and compiled["step_ms"] > 0
    assert record["levers_on"]["x_nanogpt"] > 0
    # the train stage's own loop beside the plain one, with the levers the protocol kept
    assert record["ours"]["tokens_per_s"] > 0 and record["ours"]["x_nanogpt"] > 0
    assert record["ours"]["levers"] == [k for k in record["ablate"]["kept"] if "optimizer" not in k]
