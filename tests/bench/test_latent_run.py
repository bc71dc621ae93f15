"""ltm.bench.latent_run as its command runs it on the CPU (--tiny, eager): the record a GPU
call writes, with every row timed and the plain step as the reference of the ratios."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_latent_bench_writes_its_record_on_the_cpu(tmp_path):
    out = tmp_path / "latent.json"
    done = subprocess.run([sys.executable, "-m", "ltm.bench.latent_run", str(out), "--tiny",
                           "--no-compile", "--repeats", "2"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["tiny"] is True and record["device"] == "cpu"
    assert {"rows", "skipped", "reference", "latent", "model"} <= set(record)
    rows = record["rows"]
    assert rows and all(row["error"] is None and row["ms"] > 0 for row in rows)
    # the plain step is the reference of every ratio
    assert rows[0]["case"] == "plain step" and rows[0]["x_plain"] == 1.0
    assert any(row["case"].startswith("latent step") for row in rows)


def test_the_semi_amortised_step_is_timed_with_its_encoder(tmp_path):
    out = tmp_path / "latent.json"
    done = subprocess.run([sys.executable, "-m", "ltm.bench.latent_run", str(out), "--tiny",
                           "--no-compile", "--repeats", "1", "--init", "encoder",
                           "--inner-steps", "1"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["latent"]["init"] == "encoder" and record["sizes"]["inner_steps"] == 1
    assert any(row["case"] == "latent step (encoder + 1 inner)" and row["error"] is None
               for row in record["rows"])
