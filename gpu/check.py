"""The GPU check: every GPU path of the product in one run, one table, one record.

    python3 gpu/check.py [--out DIR] [--only attention,deltanet] [--steps 10] [--no-tests]

1. the GPU kernel tests (tests/kernels, tests/ops: every op, forward and backward, odd sizes,
   float32 and bf16 against float64 references), one pytest run spread over the GPU, started
   first and run beside the training cases (on a fresh machine both are mostly compilation:
   one after the other they took ~12 minutes on an H200);
2. a short training run (random tokens) of every mixer, eager and compiled, plain and with latent
   thoughts: the GPU profile (configs/gpu.yaml) with fewer layers;
3. cached generation of each mixer's trained model, checked token by token against a full
   forward pass;
4. DDP on two GPUs (torchrun) when the machine has two.

A failure is a row, not a stop: the table shows every broken case at once. The record (device,
versions, commit, rows) goes to DIR/check.json, rewritten after each row so that a run cut short
keeps what it measured; copy it into records/gpu/check/ to cite it. Tokens/s are smoke figures:
the cases share the GPU with the tests and each other's compilation (`--workers 1 --no-tests`
for clean ones). `--tiny` runs a CPU-sized
model (the CI test of this script, Triton through its interpreter).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ltm.model.decoding import Sampling, generate_tokens  # noqa: E402
from ltm.train.settings import load_configs  # noqa: E402
from ltm.train.trainer import Trainer  # noqa: E402

# each mixer as params overrides of the GPU profile
MIXERS = {
    "attention": ["model.mixer=attention"],
    "attention-window": ["model.mixer=attention", "model.window=256"],
    "rwkv7": ["model.mixer=rwkv7"],
    "deltanet": ["model.mixer=deltanet"],
    "deltanet-hier": ["model.mixer=deltanet", "model.hierarchical=true"],
    "deltanet-hier-dual": ["model.mixer=deltanet", "model.hierarchical=true",
                           "model.hier_op=dual"],
    "titans": ["model.mixer=titans", "model.titans_depth=1", "model.titans_window=256"],
    # the deep memory (the default depth 2, an MLP) by its own Triton kernel
    "titans-deep": ["model.mixer=titans", "model.titans_depth=2", "model.titans_window=256"],
}
# latent thoughts: 8 per layer, 2 inner steps, evaluated after those 2 steps only
LATENT = ["model.n_latent=8", "train.latent.steps=2", "train.latent.eval_steps=[2]",
          "train.latent.iwae_samples=[]", "train.latent.eval_batches=1"]
# the smoke run: 4 layers of the GPU profile at T 1024, B 8 (a CPU-sized model with --tiny)
GPU_RUN = ["model.n_layers=4", "train.seq_len=1024", "train.batch_size=8", "train.data=synthetic",
           "train.eval_batches=1", "train.checkpoint_every=0"]
TINY_RUN = ["model.vocab_size=64", "model.n_layers=1", "model.d_model=32", "model.n_heads=2",
            "model.d_ff=64", "model.max_seq_len=64", "train.seq_len=40", "train.batch_size=2",
            "train.data=synthetic", "train.eval_batches=1", "train.device=cpu",
            "train.opt.amp=off", "train.opt.workers=0", "train.opt.pin_memory=false",
            "train.opt.fused_adamw=false", "model.titans_window=8"]
KERNEL_TESTS = ["tests/kernels/test_kernels_delta_rule.py", "tests/kernels/test_kernels_state_passes.py",
                "tests/kernels/test_kernels_delta_rule_fused_output.py",
                "tests/kernels/test_kernels_delta_rule_overlapped.py",
                "tests/kernels/test_kernels_rwkv7_chunk.py", "tests/kernels/test_kernels_rwkv7.py",
                "tests/kernels/test_kernels_titans.py", "tests/kernels/test_kernels_titans_deep.py",
                "tests/kernels/test_kernels_short_conv.py",
                "tests/kernels/test_kernels_step.py", "tests/ops"]


def versions() -> dict:
    import triton
    found = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    try:
        from importlib.metadata import version
        found["fla-core"] = version("fla-core")
    except Exception:  # fla is optional: the check never needs it
        pass
    return found


def device_name() -> str:
    if not torch.cuda.is_available():
        return "cpu"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def error_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


OUTCOME = re.compile(r"(PASSED|FAILED|ERROR|SKIPPED)\s+(tests/\S+?\.py)::(\S+)|"
                     r"(tests/\S+?\.py)::(\S+)\s+(PASSED|FAILED|ERROR|SKIPPED)")


def test_outcomes(log: str) -> dict[str, dict]:
    """Per test file: passed / failed / skipped counts and the first failure, read from pytest's
    verbose lines (with or without xdist), so that a run cut at its limit still tells."""
    files: dict[str, dict] = {}
    for match in OUTCOME.finditer(log):
        outcome = match.group(1) or match.group(6)
        path, test = (match.group(2), match.group(3)) if match.group(1) else match.group(4, 5)
        row = files.setdefault(Path(path).stem, {"passed": 0, "failed": 0, "skipped": 0,
                                                 "first_failure": None})
        key = {"PASSED": "passed", "SKIPPED": "skipped"}.get(outcome, "failed")
        row[key] += 1
        if key == "failed" and row["first_failure"] is None:
            row["first_failure"] = test
    return files


class KernelTests:
    """The kernel tests in a pytest process of their own, started at once so that they run beside
    the training cases (their compilation is most of both), then read back as rows."""

    def __init__(self, timeout_s: int, workers: int):
        self.timeout_s, self.start = timeout_s, time.perf_counter()
        command = [sys.executable, "-m", "pytest", "-v", "-p", "no:warnings", "-p",
                   "no:cacheprovider", *KERNEL_TESTS, *(["-n", str(workers)] if workers > 1 else [])]
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log,
                                        stderr=subprocess.STDOUT, text=True)

    def rows(self) -> list[dict]:
        """One row per test file (passed / failed counts), and a row saying so if the run was
        cut at timeout_s from its start."""
        left = self.timeout_s - (time.perf_counter() - self.start)
        try:
            self.process.wait(timeout=max(left, 0.1))
            cut = False
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            cut = True
        self.log.seek(0)
        files = test_outcomes(self.log.read())
        self.log.close()
        seconds = round(time.perf_counter() - self.start, 1)
        done = sum(row["passed"] for row in files.values())
        rows = [{"case": f"tests {name}", "ok": row["failed"] == 0 and row["passed"] > 0,
                 "detail": f"{row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped",
                 "error": row["first_failure"] and f"first failure: {row['first_failure']}"}
                for name, row in sorted(files.items())]
        if cut or not rows:
            rows.append({"case": "kernel tests", "ok": False, "seconds": seconds,
                         "error": f"cut at {self.timeout_s} s after {done} tests passed" if cut
                         else f"no test ran (pytest exit {self.process.returncode})"})
        return rows


def kernel_test_rows(timeout_s: int, workers: int) -> list[dict]:
    """The kernel tests alone, waited for: their rows."""
    return KernelTests(timeout_s, workers).rows()


def greedy_matches_full_forward(model, prompt_len: int, new_tokens: int, device) -> str | None:
    """Cached greedy generation against the full forward pass: each generated token must be the
    argmax of the full pass's logits (up to a near-tie). None when it holds, else what differs."""
    torch.manual_seed(0)
    prompts = torch.randint(0, model.cfg.vocab_size, (2, prompt_len))
    new = generate_tokens(model, list(prompts), new_tokens, Sampling(0))  # (2, new_tokens)
    sequence = torch.cat([prompts, new.cpu()], dim=1).to(device)
    with torch.no_grad():
        logits = model(sequence[:, :-1])[0].float()  # (2, T - 1, vocab)
    scored = logits[:, prompt_len - 1:]  # the logits that chose each new token
    chosen = scored.gather(-1, new.to(device)[..., None])[..., 0]
    gap = (scored.max(-1).values - chosen).max().item()
    return None if gap <= 1e-2 * max(1.0, scored.abs().max().item()) else f"token off argmax by {gap:.3g}"


def training_row(name: str, overrides: list[str], params: str, compiled: bool,
                 latent: bool, generate: bool) -> dict:
    label = f"{name} {'compiled' if compiled else 'eager'}{' +latent' if latent else ''}"
    row = {"case": label, "ok": False}
    sets = [*overrides, f"train.opt.compile={str(compiled).lower()}", *(LATENT if latent else [])]
    try:
        model_cfg, train_cfg, cache_dir = load_configs(params, sets)
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(model_cfg, train_cfg, cache_dir, out, progress=False)
            # the first step (compilation) while other cases may hold the GPU; the rest alone
            trainer.train_step(trainer.loader(), {"data_wait": 0.0, "excluded": 0.0,
                                                  "start": time.perf_counter()})
            with gpu_turn():
                metrics = trainer.run().metrics
        loss = metrics["train_loss"]
        row.update(tokens_per_s=metrics.get("tokens_per_s"), peak_mib=metrics.get("peak_memory_mib"),
                   loss=round(loss, 4))
        row["ok"] = bool(torch.isfinite(torch.tensor(loss)))
        if not row["ok"]:
            row["error"] = f"loss {loss}"
        if generate and row["ok"]:
            why = greedy_matches_full_forward(trainer.model.eval(), 7, 9, trainer.device)
            row["generation"] = "ok" if why is None else why
            row["ok"] = why is None
    except Exception as err:  # a row, not a stop: the table shows every broken case
        row["error"] = error_line(err)
        row["trace"] = traceback.format_exc()[-2000:]
    finally:
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return row


@contextlib.contextmanager
def gpu_turn():
    """The GPU to this case alone while it is timed (LTM_CHECK_LOCK: a lock file shared by the
    parallel cases; unset: no lock)."""
    path = os.environ.get("LTM_CHECK_LOCK")
    if not path:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def case_in_a_worker(case: tuple[str, str, bool], argv: list[str], lock: str) -> dict:
    """One case in a process of its own (its compilation overlaps other cases'; the timed steps
    take the GPU lock), its row read back from a file."""
    name, mode, latent = case
    with tempfile.TemporaryDirectory() as folder:
        row_file = Path(folder) / "row.json"
        command = [sys.executable, str(Path(__file__).resolve()), *argv, "--case",
                   f"{name}:{mode}:{int(latent)}", "--row-file", str(row_file)]
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "LTM_CHECK_LOCK": lock},
                              capture_output=True, text=True)
        if row_file.exists():
            return json.loads(row_file.read_text())
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"case": f"{name} {mode}{' +latent' if latent else ''}", "ok": False,
                "error": f"worker exit {done.returncode}: {tail[0][:250]}"}


def ddp_row(params: str, overrides: list[str]) -> dict:
    """Two processes through torchrun, one per GPU, on the compiled attention model."""
    row = {"case": "ddp 2 GPUs attention compiled", "ok": False}
    with tempfile.TemporaryDirectory() as out:
        metrics = Path(out) / "train.json"
        command = ["torchrun", "--standalone", "--nproc_per_node=2", "-m", "ltm.stages.train",
                   "--params", params, "--no-progress", "--out", out, "--metrics", str(metrics),
                   *[f"--set={item}" for item in overrides]]
        env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=300)
        except subprocess.TimeoutExpired:
            return {**row, "error": "cut at 300 s"}
        if done.returncode != 0 or not metrics.exists():
            return {**row, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
        m = json.loads(metrics.read_text())
        return {**row, "ok": m.get("world_size") == 2, "tokens_per_s": m.get("tokens_per_s"),
                "peak_mib": m.get("peak_memory_mib"), "loss": m.get("train_loss")}


def table(rows: list[dict]) -> str:
    lines = [f"{'case':<42} {'':<5} {'tokens/s':>10} {'peak MiB':>9}  detail"]
    for r in rows:
        tok = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
        mem = f"{r['peak_mib']:,.0f}" if r.get("peak_mib") else "-"
        detail = r.get("error") or r.get("detail") or (f"loss {r['loss']}" if "loss" in r else "")
        detail += f", generation {r['generation']}" if "generation" in r and not r.get("error") else ""
        lines.append(f"{r['case']:<42} {'ok' if r['ok'] else 'FAIL':<5} {tok:>10} {mem:>9}  {detail}")
    failed = sum(not r["ok"] for r in rows)
    lines.append(f"{len(rows) - failed} of {len(rows)} cases passed" + (f"; {failed} FAILED" if failed else ""))
    return "\n".join(lines)


def run_cases(cases: list[tuple], workers: int, base: list[str], params: str, argv: list[str],
              out: Path, add: Callable[[list[dict]], None]) -> None:
    """The training cases (mixer, mode, latent), each row handed to `add` as it is done: in this
    process one after another (one worker), or each in a process of its own, `workers` at once."""
    if workers == 1:
        for name, mode, latent in cases:
            add([training_row(name, [*MIXERS[name], *base], params, mode == "compiled",
                              latent, generate=not latent and mode == "eager")])
        return
    lock = str(out / "gpu.lock")
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        # compiled cases first: their compilation is the long part
        order = sorted(cases, key=lambda c: c[1] != "compiled")
        futures = [pool.submit(case_in_a_worker, case, argv, lock) for case in order]
        for future in concurrent.futures.as_completed(futures):
            add([future.result()])


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu/results", help="folder of check.json")
    parser.add_argument("--params", default=str(ROOT / "configs" / "gpu.yaml"))
    parser.add_argument("--only", default="", help="comma-separated mixers (default: all)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--no-tests", action="store_true", help="skip the kernel tests")
    parser.add_argument("--no-latent", action="store_true")
    parser.add_argument("--tests-timeout", type=int, default=420,
                        help="seconds the kernel tests may take, from the check's start")
    parser.add_argument("--tiny", action="store_true", help="a CPU-sized model (CI)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--workers", type=int, default=None,
                        help="cases run at once (compilation overlaps; the timed steps take turns "
                             "on the GPU); default 4 on a GPU, 1 on a CPU")
    parser.add_argument("--commit", default=None, help="the commit to record (default: git's)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a worker's one case: name:mode:latent
    parser.add_argument("--row-file", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = argument_parser().parse_args(argv)
    unknown = [m for m in args.only.split(",") if m and m not in MIXERS]
    if unknown:
        raise SystemExit(f"error: unknown mixer {unknown[0]!r}; expected one of {', '.join(MIXERS)}")
    base = [*(TINY_RUN if args.tiny else GPU_RUN), f"train.steps={args.steps}",
            f"train.timing_warmup={max(1, args.steps // 2)}", f"train.eval_every={args.steps}",
            *args.set]
    if args.case:
        name, mode, latent = args.case.split(":")
        row = training_row(name, [*MIXERS[name], *base], args.params, mode == "compiled",
                           latent == "1", generate=latent == "0" and mode == "eager")
        Path(args.row_file).write_text(json.dumps(row))
        return 0
    mixers = [m for m in MIXERS if not args.only or m in args.only.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"what": "gpu/check.py: kernel tests, training of every mixer eager and compiled, "
                      "plain and latent, cached generation, DDP",
              "date": time.strftime("%Y-%m-%d"), "device": device_name(), "versions": versions(),
              "commit": args.commit or commit(), "command": " ".join(["python3 gpu/check.py", *argv]),
              "settings": base, "rows": []}

    def add(rows: list[dict]) -> None:
        for row in rows:
            record["rows"].append(row)
            status = "ok" if row["ok"] else f"FAIL {row.get('error', '')}"
            print(f"{row['case']}: {status}", flush=True)
        (out / "check.json").write_text(json.dumps(record, indent=1))

    # the kernel tests run beside the training cases (both mostly compile): their rows come first
    # half the host's cores for the tests' compilation (16 workers ran them alone in 335 s on a
    # 2 x H200 host of 32 cores; 8 beside the training cases were cut at 500 s)
    test_workers = 1 if args.tiny else min(16, max(8, (os.cpu_count() or 16) // 2))
    tests = None if args.no_tests else KernelTests(args.tests_timeout, test_workers)
    cases = [(name, mode, latent) for name in mixers
             for latent in ((False,) if args.no_latent else (False, True))
             for mode in args.modes.split(",")]
    run_cases(cases, args.workers or (4 if torch.cuda.is_available() else 1), base, args.params,
              argv, out, add)
    rank = {f"{n} {m}{' +latent' if l else ''}": i for i, (n, m, l) in enumerate(cases)}
    record["rows"].sort(key=lambda r: rank.get(r["case"], -1))
    if torch.cuda.device_count() >= 2:
        add([ddp_row(args.params, [*MIXERS["attention"], *base])])
    if tests is not None:
        test_rows = tests.rows()
        record["rows"] = test_rows + record["rows"]
        add([])
        for row in test_rows:
            print(f"{row['case']}: {'ok' if row['ok'] else 'FAIL ' + str(row.get('error', ''))}")
    print(table(record["rows"]))
    return 0 if all(r["ok"] for r in record["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
