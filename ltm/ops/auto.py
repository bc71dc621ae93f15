"""`model.kernel: auto`: per op and shape class, the implementation measured fastest on this device.

The ops' entry points call `choose` when given kernel "auto"; it returns the name of an
implementation the entry point already has ("triton", "fla" or "torch"), picked from a measured
table. Only implementations that compute the same function for that call compete: the entry point
says which (`candidates`; e.g. the Titans memory reaches fla only in its exact case, see
ltm/ops/titans/__init__.py), and "fla" drops out wherever fla is not installed.

Rules, in order:
    not on CUDA                       -> "torch" (the chunked PyTorch form; the Triton kernels
                                         would run in Triton's interpreter)
    the table for this device (its exact name) has an entry for the call's class -> the fastest of
        the candidates that entry measured (`fastest`)
    otherwise (or none of them measured at a common shape) -> "triton" where it is a candidate,
                                         else "torch"
One-token decoding takes our step kernel on CUDA, the PyTorch step elsewhere (`one_token_kernel`).

fla as installed and fla's own Triton path are one implementation, "fla", told apart by the
environment: with flash-qla (or tilelang) installed fla hands the gated delta rule at K = V = 128
to FlashQLA unless FLA_FLASH_QLA=0 (FLA_TILELANG=0). fla reads those switches at every dispatch,
the backward's included, so auto never sets them: it reads them, and compares ours with the
column of the table measured the way this process would run fla (`fla_column`).

Tables (JSON, one per device; `python -m ltm.bench.kernels --tune --out PATH` writes one, and
LTM_AUTO_TABLE=PATH makes it the first one looked at; the shipped ones are in auto_tables/):
    {"version": 1, "device": "NVIDIA H100 80GB HBM3", "sm_count": 132, "torch": ..., "triton": ...,
     "fla": ..., "fla_backends": ["flash_qla", ...], "commit": ..., "date": ..., "sources": [...],
     "entries": [{"op": "delta_rule", "pass": "training", "dtype": "bfloat16", "D": 128,
                  "T": "<=2048", "bh_per_sm": "0.25-1", "shapes": [[B, T, H, D], ...],
                  "ms": {"triton": [ms per shape], "fla_triton": [...], "fla_installed": [...]},
                  "winner": "triton"}]}
"ms" lists line up with "shapes"; null = not measured there, or it failed ("errors": column ->
the first error; such a column is never chosen in that entry). "winner" is the fastest over the
other columns, for a reader; `choose` recomputes it over the columns this process can run.
A shape class: op, pass ("training" = forward + backward, "inference" = forward), dtype, the head
dim D (K = V), T up to the next edge of T_EDGES, and B * H per streaming multiprocessor in the
buckets of BH_PER_SM_EDGES (how many sequential state passes the kernels run side by side).

Every choice is recorded the first time it is made (`chosen`): the train stage writes them to
its results. Under torch.compile the table lookup runs once per trace
(`torch.compiler.assume_constant_result`) and the bucket comparisons become guards.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Sequence

import torch

AUTO = "auto"
TABLE_VERSION = 1
TABLE_DIR = Path(__file__).resolve().parent / "auto_tables"
TABLE_ENV = "LTM_AUTO_TABLE"
PASSES = ("training", "inference")
# the class of T: the first edge at or above it
T_EDGES = (512, 1024, 2048, 4096, 8192, 16384, 32768)
# B * H over the SM count: under a quarter, the sequential passes leave most SMs idle; from 4
# on, every SM has several
BH_PER_SM_EDGES = (0.25, 1.0, 4.0)
# a table's columns: ours, the chunked PyTorch form (the Titans memory's only rival to fla), and
# fla on its Triton path alone and as installed with its backends
COLUMNS = ("triton", "torch", "fla_triton", "fla_installed")
# fla's optional backends (package -> the environment switch that turns it off with "0")
FLA_BACKENDS = {"flash_qla": "FLA_FLASH_QLA", "tilelang": "FLA_TILELANG"}

# (op, pass, dtype, D, T class, B*H class, device type and index, candidates) -> the choice made
_CHOICES: dict[tuple, dict] = {}
# device name -> (table or None, its path or None)
_TABLES: dict[str, tuple[dict | None, str | None]] = {}


def t_class(T: int) -> str:
    """The T bucket: "<=E" for the first edge E >= T, ">32768" past the last."""
    for edge in T_EDGES:
        if T <= edge:
            return f"<={edge}"
    return f">{T_EDGES[-1]}"


def bh_class(BH: int, sm_count: int) -> str:
    """The B * H bucket relative to the SM count: "<0.25", "0.25-1", "1-4", ">=4"."""
    low = None
    for edge in BH_PER_SM_EDGES:
        if BH < edge * sm_count:
            return f"<{edge:g}" if low is None else f"{low:g}-{edge:g}"
        low = edge
    return f">={low:g}"


def shape_class(op: str, B: int, T: int, H: int, D: int, dtype: torch.dtype, *, training: bool,
                sm_count: int) -> dict:
    """The class of a call as a table entry names it (see the module docstring)."""
    return {"op": op, "pass": PASSES[0] if training else PASSES[1], "dtype": dtype_name(dtype),
            "D": D, "T": t_class(T), "bh_per_sm": bh_class(B * H, sm_count)}


def dtype_name(dtype: torch.dtype) -> str:
    """"bfloat16" for torch.bfloat16: the tables' spelling."""
    return str(dtype).removeprefix("torch.")


def check_table(table: dict, where: str) -> dict:
    """The table itself, or a one-line error naming what is wrong with it."""
    if not isinstance(table, dict) or table.get("version") != TABLE_VERSION:
        raise ValueError(f"{where}: not a kernel table of version {TABLE_VERSION}")
    for entry in table.get("entries", ()):
        n = len(entry.get("shapes", ()))
        if any(name not in COLUMNS or len(ms) != n for name, ms in entry.get("ms", {}).items()):
            raise ValueError(f"{where}: the ms of entry {entry.get('op')} {entry.get('pass')} "
                             f"D{entry.get('D')} T{entry.get('T')} must hold one value per shape "
                             f"for columns of {COLUMNS}")
    return table


def read_table(path: str | Path) -> dict:
    """A table file, checked (one-line errors for a missing file, bad JSON or bad contents)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{TABLE_ENV}: no such kernel table {path}")
    try:
        return check_table(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def to_json(table: dict) -> str:
    """A table as the files hold it: indented, each list of numbers on one line."""
    text = json.dumps(table, indent=1)
    flat = lambda m: "[" + ", ".join(part.strip() for part in m.group(1).split(",")) + "]"
    return re.sub(r"\[\s*([-\d.,\se+null]*?)\s*\]", flat, text) + "\n"


def table_for(device_name: str) -> tuple[dict | None, str | None]:
    """The table measured on a device of exactly this name, and its path: LTM_AUTO_TABLE's file
    first, then the shipped ones; (None, None) when none was (another GPU model has other SM
    counts and clocks, so a table never stands in for a device it was not measured on)."""
    if device_name not in _TABLES:
        paths = [Path(os.environ[TABLE_ENV])] if os.environ.get(TABLE_ENV) else []
        found = (None, None)
        for path in paths + sorted(TABLE_DIR.glob("*.json")):
            table = read_table(path)
            if table["device"] == device_name:
                found = (table, str(path))
                break
        _TABLES[device_name] = found
    return _TABLES[device_name]


def fla_installed() -> bool:
    """Whether flash-linear-attention can be imported here (without importing it)."""
    return importlib.util.find_spec("fla") is not None


def enabled_backends() -> list[str]:
    """fla's optional backends that this process would dispatch to: installed and not switched
    off by their environment variable."""
    return sorted(package for package, switch in FLA_BACKENDS.items()
                  if importlib.util.find_spec(package) is not None
                  and os.environ.get(switch, "1") != "0")


def fla_column(table: dict) -> str | None:
    """The table column that measured fla as this process runs it: its Triton path when no
    backend is on here, "fla_installed" when the same backends were on where the table was
    measured; None (fla unmeasured as it would run here) otherwise."""
    backends = enabled_backends()
    if not backends:
        return "fla_triton"
    return "fla_installed" if backends == sorted(table.get("fla_backends", ())) else None


def fastest(ms: dict[str, list], columns: Sequence[str]) -> str | None:
    """The column with the least total time over the shapes where every one of `columns` was
    measured (so each comparison is between times taken at the same shapes); None where no shape
    has them all."""
    n = max((len(times) for times in ms.values()), default=0)
    common = [i for i in range(n)
              if all(ms.get(c) is not None and ms[c][i] is not None for c in columns)]
    if not columns or not common:
        return None
    return min(columns, key=lambda c: sum(ms[c][i] for i in common))


def default_kernel(candidates: Sequence[str]) -> str:
    """Without a measurement: ours where it computes the call, else the chunked PyTorch form."""
    return "triton" if "triton" in candidates else "torch"


def _entry(table: dict, key: dict) -> dict | None:
    return next((e for e in table.get("entries", ())
                 if all(e.get(name) == value for name, value in key.items())), None)


def _from_table(key: dict, candidates: Sequence[str], device_name: str) -> tuple[str, str]:
    """(implementation, why) for a CUDA call of class `key` among `candidates`."""
    table, path = table_for(device_name)
    if table is None:
        return default_kernel(candidates), f"no kernel table for {device_name}"
    entry = _entry(table, key)
    name = Path(path).name
    if entry is None:
        return default_kernel(candidates), f"no entry for this class in {name}"
    # a column that failed at any shape of the class (fla refusing a backward) is not chosen in it
    column_of = {c: fla_column(table) if c == "fla" else c for c in candidates}
    columns = [col for col in column_of.values()
               if col is not None and col not in entry.get("errors", {})]
    best = fastest(entry["ms"], columns)
    if best is None:
        return default_kernel(candidates), f"{name} did not measure these candidates together"
    impl = next(c for c, col in column_of.items() if col == best)
    return impl, f"fastest in {name} of {', '.join(columns)}"


@torch.compiler.assume_constant_result
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None
                                            else index).multi_processor_count


@torch.compiler.assume_constant_result
def _lookup(op: str, pass_kind: str, dtype: torch.dtype, D: int, T: str, bh: str,
            device_type: str, index: int | None, candidates: tuple[str, ...]) -> str:
    """The choice for one class (plain Python, run once per torch.compile trace), recorded the
    first time it is made."""
    key = (op, pass_kind, dtype, D, T, bh, device_type, index, candidates)
    if key not in _CHOICES:
        entry_key = {"op": op, "pass": pass_kind, "dtype": dtype_name(dtype), "D": D, "T": T,
                     "bh_per_sm": bh}
        if device_type != "cuda":
            device_name, impl, why, available = device_type, "torch", "not on CUDA", ["torch"]
        else:
            device_name = torch.cuda.get_device_name(index)
            # an implementation that needs fla is never chosen where fla is not installed
            available = [c for c in candidates if c != "fla" or fla_installed()]
            impl, why = _from_table(entry_key, available, device_name)
        _CHOICES[key] = {**entry_key, "device": device_name, "candidates": available,
                         "impl": impl, "why": why}
    return _CHOICES[key]["impl"]


def resolve(op: str, B: int, T: int, H: int, D: int, dtype: torch.dtype, device: torch.device, *,
            training: bool, candidates: Sequence[str], value_dim: int | None = None) -> str:
    """The implementation `kernel: auto` runs for op at [B, T, H, D] (`value_dim`: V where it is
    not D), among `candidates` (the implementations computing this call's function)."""
    pass_kind = PASSES[0] if training else PASSES[1]
    if device.type != "cuda":
        return _lookup(op, pass_kind, dtype, D, t_class(T), "-", device.type, None, ("torch",))
    if value_dim is not None and value_dim != D:
        return default_kernel(candidates)  # the tables measure K = V only
    sm_count = _multiprocessors(device.index)
    return _lookup(op, pass_kind, dtype, D, t_class(T), bh_class(B * H, sm_count), device.type,
                   device.index, tuple(candidates))


def choose(op: str, q: torch.Tensor, v: torch.Tensor, inputs: Sequence[torch.Tensor | None], *,
           candidates: Sequence[str]) -> str:
    """`resolve` for an entry point's sequence call: q [B, T, H, K], v [B, T, H, V] (the kernels
    run in v's dtype), training when autograd will run a backward through any of `inputs`."""
    B, T, H, D = q.shape
    training = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
    return resolve(op, B, T, H, D, v.dtype, v.device, training=training, candidates=candidates,
                   value_dim=v.shape[-1])


def one_token_kernel(device: torch.device) -> str:
    """One decoding step under auto: our step kernel on CUDA, the PyTorch step elsewhere (the
    tables hold sequences only; fla has no step of its own here)."""
    return "triton" if device.type == "cuda" else "torch"


def chosen() -> list[dict]:
    """Every choice made in this process so far, in order: class, candidates, implementation and
    why."""
    return [dict(choice) for choice in _CHOICES.values()]


def forget() -> None:
    """Drop the recorded choices and the loaded tables (a new run; a changed LTM_AUTO_TABLE)."""
    _CHOICES.clear()
    _TABLES.clear()
