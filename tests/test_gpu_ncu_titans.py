"""gpu/ncu_titans.py's reading of Nsight Compute's `--page details --csv` output: one entry per
profiled kernel, the kept metrics with their units, the stall reasons largest first, and ncu's
own notes and the program's prints skipped."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value","Rule Name","Rule Type","Rule Description"')


def row(kid: str, kernel: str, section: str, name: str, unit: str, value: str) -> str:
    fields = [kid, "4242", "python3", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)", "(96, 1, 1)",
              "0", "9.0", section, name, unit, value, "", "", ""]
    return ",".join(f'"{f}"' for f in fields)


def load():
    spec = importlib.util.spec_from_file_location("ncu_titans", ROOT / "gpu" / "ncu_titans.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_details_csv_gives_one_entry_per_kernel_with_its_stalls_largest_first():
    state = "_deep_bwd_state_kernel(float *, float *, int, int)"
    lines = [
        "==PROF== Connected to process 4242 (python3)",
        "==PROF== Profiling \"_deep_bwd_state_kernel\" - 0: 0%....50%....100% - 41 passes",
        HEADER,
        row("0", state, "GPU Speed Of Light Throughput", "Duration", "ms", "10.05"),
        row("0", state, "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "3.12"),
        row("0", state, "Launch Statistics", "Registers Per Thread", "register/thread", "255"),
        row("0", state, "Launch Statistics", "Waves Per SM", "", "0.73"),
        row("0", state, "Command line profiler metrics",
            "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "",
            "1,234.5"),
        row("0", state, "Command line profiler metrics",
            "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "9.5"),
        row("0", state, "Command line profiler metrics",
            "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "", "0"),
        row("1", "_deep_output_kernel", "GPU Speed Of Light Throughput", "Duration", "us",
            "870.40"),
        "ok",
    ]
    kernels = load().parse("\n".join(lines))
    assert [k["kernel"] for k in kernels] == ["_deep_bwd_state_kernel", "_deep_output_kernel"]
    first = kernels[0]
    assert first["metrics"] == {"Duration": "10.05 ms", "DRAM Throughput": "3.12 %",
                                "Registers Per Thread": "255 register/thread"}
    assert list(first["stalls"]) == ["long_scoreboard", "barrier", "wait"]
    assert first["stalls"]["long_scoreboard"] == 1234.5
    assert first["grid"] == "(96, 1, 1)" and kernels[1]["stalls"] == {}
