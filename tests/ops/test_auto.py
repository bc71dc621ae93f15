"""`model.kernel: auto` (ltm/ops/auto.py): the shape classes, the tables (loading, one-line
errors, the shipped ones), the choice and its fallbacks (CPU, unknown device, no entry, fla not
installed, fla's backends switched on or off), the choices recorded, the candidates each entry
point offers, under torch.compile, and that auto computes the function of the implementation it
runs (float64, odd sizes, forward and backward, on the CPU)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ltm.ops import auto, check_kernel
from ltm.ops.delta_rule import delta_rule
from ltm.ops.dual_delta_rule import dual_delta_rule
from ltm.ops.rwkv7 import rwkv7
from ltm.ops.titans import titans_memory
import ltm.ops.delta_rule as delta_rule_module
import ltm.ops.titans as titans_module

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA = torch.device("cuda")
GPU_NAME = "Test GPU"
SMS = 100
# the SM count's reader, before the fixture below replaces it
REAL_MULTIPROCESSORS = auto._multiprocessors


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No recorded choice, no cached table, no user table, no fla backend switch from outside;
    a fake CUDA device (name, SM count) for the calls given device=CUDA."""
    for name in (auto.TABLE_ENV, *auto.FLA_BACKENDS.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: GPU_NAME)
    monkeypatch.setattr(auto, "_multiprocessors", lambda index: SMS)
    auto.forget()
    yield
    auto.forget()


def entry(winner_ms: dict, **cls) -> dict:
    """A table entry of class delta_rule training bfloat16 D64 T<=2048 BH/SM 0.25-1 (or `cls`)."""
    key = {"op": "delta_rule", "pass": "training", "dtype": "bfloat16", "D": 64, "T": "<=2048",
           "bh_per_sm": "0.25-1", **cls}
    n = len(next(iter(winner_ms.values())))
    return {**key, "shapes": [[8, 2048, 4, 64]] * n, "ms": winner_ms, "winner": None}


def write_table(tmp_path, monkeypatch, entries: list, device: str = GPU_NAME,
                backends: tuple = ()) -> None:
    table = {"version": auto.TABLE_VERSION, "device": device, "sm_count": SMS,
             "fla_backends": list(backends), "entries": entries}
    path = tmp_path / "table.json"
    path.write_text(auto.to_json(table))
    monkeypatch.setenv(auto.TABLE_ENV, str(path))


def pick(candidates=("triton", "fla"), B=8, T=2048, H=4, D=64, training=True,
         dtype=torch.bfloat16, device=CUDA, value_dim=None) -> str:
    return auto.resolve("delta_rule", B, T, H, D, dtype, device, training=training,
                        candidates=candidates, value_dim=value_dim)


def fla_present(monkeypatch, present: bool = True, backends: tuple = ()) -> None:
    monkeypatch.setattr(auto, "fla_installed", lambda: present)
    monkeypatch.setattr(auto, "enabled_backends", lambda: sorted(backends))


# -- shape classes ------------------------------------------------------------------------------

@pytest.mark.parametrize("T, label", [(1, "<=512"), (512, "<=512"), (513, "<=1024"),
                                      (2048, "<=2048"), (2049, "<=4096"), (32768, "<=32768"),
                                      (32769, ">32768")])
def test_t_class_is_the_first_edge_at_or_above_t(T, label):
    assert auto.t_class(T) == label


@pytest.mark.parametrize("BH, label", [(1, "<0.25"), (32, "<0.25"), (33, "0.25-1"),
                                       (131, "0.25-1"), (132, "1-4"), (527, "1-4"), (528, ">=4")])
def test_bh_class_is_b_times_h_per_sm(BH, label):
    assert auto.bh_class(BH, 132) == label


def test_shape_class_names_the_entry_fields():
    assert auto.shape_class("rwkv7", 2, 8192, 6, 128, torch.bfloat16, training=False,
                            sm_count=132) == {"op": "rwkv7", "pass": "inference",
                                              "dtype": "bfloat16", "D": 128, "T": "<=8192",
                                              "bh_per_sm": "<0.25"}


# -- tables -------------------------------------------------------------------------------------

def test_fastest_compares_only_shapes_every_column_measured():
    ms = {"triton": [1.0, 2.0, 5.0], "fla_triton": [1.5, 2.5, None], "fla_installed": [None, None, 4.0]}
    assert auto.fastest(ms, ["triton", "fla_triton"]) == "triton"
    assert auto.fastest(ms, ["triton", "fla_installed"]) == "fla_installed"
    assert auto.fastest(ms, ["triton", "fla_triton", "fla_installed"]) is None
    assert auto.fastest(ms, ["torch"]) is None


@pytest.mark.parametrize("text, message", [
    (None, "no such kernel table"),
    ("{not json", "not valid JSON"),
    (json.dumps({"version": 99, "device": "x"}), "not a kernel table of version 1"),
    (json.dumps({"version": 1, "device": "x", "entries": [
        {"shapes": [[1, 2, 3, 4]], "ms": {"triton": [1.0, 2.0]}}]}), "one value per shape"),
    (json.dumps({"version": 1, "device": "x", "entries": [
        {"shapes": [[1, 2, 3, 4]], "ms": {"ours": [1.0]}}]}), "one value per shape"),
])
def test_a_bad_table_is_a_one_line_error(tmp_path, text, message):
    path = tmp_path / "table.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        auto.read_table(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["h100", "h200"])
def test_the_shipped_tables_load_and_name_their_sources(name):
    table = auto.read_table(auto.TABLE_DIR / f"{name}.json")
    assert table["device"] in ("NVIDIA H100 80GB HBM3", "NVIDIA H200") and table["entries"]
    assert all(s["file"].startswith("records/bench/") and s["commit"] for s in table["sources"])
    for e in table["entries"]:
        ok = [c for c in e["ms"] if c not in e.get("errors", {})]
        assert e["winner"] == auto.fastest(e["ms"], ok), e
        assert e["op"] in ("delta_rule", "rwkv7") and e["pass"] in auto.PASSES


def test_the_shipped_h100_table_has_fla_as_installed_winning_somewhere():
    """FlashQLA beat ours at few sequences of D = 128 (records/bench/references): the table must
    say so, or it did not read the references."""
    table = auto.read_table(auto.TABLE_DIR / "h100.json")
    assert table["fla_backends"] == ["flash_qla", "tilelang"]
    assert {e["winner"] for e in table["entries"] if e["op"] == "delta_rule"} == {"triton",
                                                                                  "fla_installed"}


def test_the_shipped_tables_are_package_data():
    """A wheel holds them (an editable install would hide their absence)."""
    import tomllib
    pyproject = tomllib.loads((auto.TABLE_DIR.parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ltm.ops.auto_tables"]
    shipped = {p.name for p in auto.TABLE_DIR.glob("*.json")}
    assert shipped == {"h100.json", "h200.json"}
    assert {p.name for pattern in patterns for p in auto.TABLE_DIR.glob(pattern)} == shipped


def test_a_table_applies_only_to_its_own_device(tmp_path, monkeypatch):
    write_table(tmp_path, monkeypatch, [], device="Another GPU")
    assert auto.table_for(GPU_NAME) == (None, None)
    table, path = auto.table_for("NVIDIA H200")  # the user's table is another GPU's: shipped
    assert table["device"] == "NVIDIA H200" and path.endswith("h200.json")


# -- the choice and its fallbacks ----------------------------------------------------------------

def test_on_the_cpu_auto_is_the_torch_form_and_says_so():
    assert pick(device=torch.device("cpu")) == "torch"
    (choice,) = auto.chosen()
    assert choice["impl"] == "torch" and choice["why"] == "not on CUDA" and choice["T"] == "<=2048"


def test_an_unknown_device_runs_ours_or_else_torch(monkeypatch):
    fla_present(monkeypatch)
    assert pick() == "triton"
    assert pick(candidates=("fla", "torch")) == "torch"
    assert auto.chosen()[0]["why"] == f"no kernel table for {GPU_NAME}"


def test_the_table_winner_runs_when_fla_is_installed(tmp_path, monkeypatch):
    write_table(tmp_path, monkeypatch, [entry({"triton": [2.0], "fla_triton": [1.0]})])
    fla_present(monkeypatch)
    assert pick() == "fla"
    assert pick(B=1) == "triton"  # B*H 4 of 100 SMs: another class, no entry
    assert [c["why"].split(" in ")[0] for c in auto.chosen()] == ["fastest", "no entry for this class"]


def test_fla_is_never_chosen_where_it_is_not_installed(tmp_path, monkeypatch):
    write_table(tmp_path, monkeypatch, [entry({"triton": [2.0], "fla_triton": [1.0]})])
    fla_present(monkeypatch, present=False)
    assert pick() == "triton"
    assert auto.chosen()[0]["candidates"] == ["triton"]


def test_fla_as_installed_is_compared_with_the_column_measured_that_way(tmp_path, monkeypatch):
    ms = {"triton": [2.0, 2.0], "fla_triton": [3.0, 3.0], "fla_installed": [1.0, None]}
    write_table(tmp_path, monkeypatch, [entry(ms)], backends=("flash_qla",))
    fla_present(monkeypatch, backends=("flash_qla",))
    assert pick() == "fla"  # FlashQLA on, as where the table was measured
    auto.forget()
    fla_present(monkeypatch, backends=())
    assert pick() == "triton"  # its Triton path alone: the fla_triton column
    auto.forget()
    fla_present(monkeypatch, backends=("tilelang",))
    assert pick() == "triton"  # backends the table never measured: fla is not compared
    assert auto.chosen()[0]["why"] == "fastest in table.json of triton"


def test_the_backend_switches_of_the_environment_decide_which_fla_runs(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    assert auto.enabled_backends() == ["flash_qla", "tilelang"]
    monkeypatch.setenv("FLA_FLASH_QLA", "0")
    monkeypatch.setenv("FLA_TILELANG", "0")
    assert auto.enabled_backends() == []
    assert auto.fla_column({"fla_backends": ["flash_qla"]}) == "fla_triton"


def test_a_winner_that_is_not_installed_falls_back_to_ours(tmp_path, monkeypatch):
    """The table's winner is fla as installed with FlashQLA; here neither fla nor its backends."""
    e = entry({"triton": [2.0], "fla_triton": [1.5], "fla_installed": [1.0]})
    e["winner"] = "fla_installed"
    write_table(tmp_path, monkeypatch, [e], backends=("flash_qla",))
    fla_present(monkeypatch, present=False)
    assert pick() == "triton"


def test_a_column_that_failed_in_a_class_is_never_chosen_there(tmp_path, monkeypatch):
    e = entry({"triton": [2.0, 2.0], "fla_triton": [1.0, None]})
    e["errors"] = {"fla_triton": "RuntimeError: refused"}
    write_table(tmp_path, monkeypatch, [e])
    fla_present(monkeypatch)
    assert pick() == "triton"


def test_other_passes_dtypes_and_head_dims_are_other_classes(tmp_path, monkeypatch):
    write_table(tmp_path, monkeypatch, [entry({"triton": [2.0], "fla_triton": [1.0]})])
    fla_present(monkeypatch)
    assert pick(training=False) == pick(dtype=torch.float32) == pick(D=128) == "triton"
    assert pick(value_dim=32) == "triton"  # K != V: the tables measure K = V only
    assert pick() == "fla"


def test_each_choice_is_recorded_once():
    pick(), pick(), pick(T=100)
    assert [c["T"] for c in auto.chosen()] == ["<=2048", "<=512"]
    auto.forget()
    assert auto.chosen() == []


def test_one_token_runs_our_step_on_cuda_and_the_torch_step_elsewhere():
    assert auto.one_token_kernel(CUDA) == "triton"
    assert auto.one_token_kernel(torch.device("cpu")) == "torch"


def test_the_choice_is_made_at_trace_time_under_torch_compile(tmp_path, monkeypatch):
    """fullgraph, shapes changing (dynamic after the first): each class is looked up once and its
    bucket comparisons become guards, so each class runs its own winner."""
    write_table(tmp_path, monkeypatch, [entry({"triton": [2.0], "fla_triton": [1.0]})])
    fla_present(monkeypatch)

    def f(x):
        kernel = auto.resolve("delta_rule", x.shape[0], x.shape[1], 4, 64, torch.bfloat16, CUDA,
                              training=True, candidates=("triton", "fla"))
        return x + (1 if kernel == "fla" else 2)

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    outputs = [compiled(torch.zeros(B, T))[0, 0].item() for B, T in
               [(8, 2048), (8, 100), (9, 2000), (2, 3000), (1, 2048)]]
    assert outputs == [1, 2, 1, 2, 2]
    assert [(c["T"], c["bh_per_sm"], c["impl"]) for c in auto.chosen()] == [
        ("<=2048", "0.25-1", "fla"), ("<=512", "0.25-1", "triton"), ("<=4096", "<0.25", "triton"),
        ("<=2048", "<0.25", "triton")]


def test_the_sm_count_is_read_once_per_trace_too(monkeypatch):
    """The real `_multiprocessors` (marked constant for torch.compile) with a fake device."""
    monkeypatch.setattr(auto, "_multiprocessors", REAL_MULTIPROCESSORS)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    reads = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: reads.append(index)
                        or type("Properties", (), {"multi_processor_count": 8})())

    def f(x):
        kernel = auto.resolve("delta_rule", x.shape[0], 64, 1, 64, torch.bfloat16, CUDA,
                              training=False, candidates=("triton",))
        return x + (1 if kernel == "triton" else 2)

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert [compiled(torch.zeros(B))[0].item() for B in (1, 4, 8, 40)] == [1, 1, 1, 1]
    assert reads and set(reads) == {0}
    assert [c["bh_per_sm"] for c in auto.chosen()] == ["<0.25", "0.25-1", "1-4", ">=4"]


def test_auto_adds_no_graph_break(monkeypatch):
    from ltm.model.config import ModelConfig
    from ltm.model.mixers import make_mixer
    counts = {}
    for kernel in ("torch", "auto"):
        cfg = ModelConfig(vocab_size=11, n_layers=2, d_model=24, n_heads=3, chunk_size=8,
                          kernel=kernel, mixer="deltanet")
        torch._dynamo.reset()
        report = torch._dynamo.explain(make_mixer(cfg, 1))(torch.randn(2, 37, 24))
        counts[kernel] = (report.graph_count, report.graph_break_count)
    assert counts["auto"] == counts["torch"] == (1, 0)


# -- the entry points ---------------------------------------------------------------------------

def test_kernel_auto_is_accepted_and_a_typo_is_one_line():
    check_kernel("auto")
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'autp', expected one of "
                                         r"naive, torch, triton, fla, auto$"):
        check_kernel("autp")


def delta_inputs(seed: int, B=2, T=37, H=3, K=24, V=24, dtype=torch.float64) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(B, T, H, K, generator=gen, dtype=dtype),
            "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=dtype), dim=-1),
            "v": torch.randn(B, T, H, V, generator=gen, dtype=dtype),
            "beta": torch.rand(B, T, H, generator=gen, dtype=dtype),
            "g": -torch.rand(B, T, H, generator=gen, dtype=dtype)}


def rwkv7_inputs(seed: int, B=2, T=37, H=3, K=24) -> dict:
    gen = torch.Generator().manual_seed(seed)
    kk = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    return {"r": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
            "w": -torch.rand(B, T, H, K, generator=gen, dtype=torch.float64),
            "k": 0.5 * torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
            "v": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
            "a": -kk, "b": kk * torch.rand(B, T, H, K, generator=gen, dtype=torch.float64)}


def titans_inputs(seed: int, B=2, T=23, H=3, D=6) -> tuple[dict, list]:
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, D, generator=gen, dtype=torch.float64),
         "k": F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=torch.float64), dim=-1),
         "v": torch.randn(B, T, H, D, generator=gen, dtype=torch.float64),
         "theta": 0.3 * torch.rand(B, T, H, generator=gen, dtype=torch.float64),
         "alpha": 0.2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64),
         "eta": torch.rand(B, T, H, generator=gen, dtype=torch.float64)}
    weights = [torch.randn(H, D, 5, generator=gen, dtype=torch.float64),
               torch.randn(H, 5, D, generator=gen, dtype=torch.float64)]
    return x, weights


def outputs_and_grads(run, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """o, the final state and every input's gradient of a fixed loss on both."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    o, state = run(leaves)
    state = state if torch.is_tensor(state) else state["S"] if isinstance(state, dict) else state[0][0]
    loss = (o * torch.linspace(-1, 1, o.shape[-1], dtype=o.dtype)).sum() + state.square().sum()
    return [o, state, *torch.autograd.grad(loss, leaves)]


OPS = {
    "delta_rule": (lambda ts, kernel: delta_rule(*ts, kernel=kernel, chunk_size=8,
                                                 output_final_state=True),
                   lambda: list(delta_inputs(0).values())),
    "rwkv7": (lambda ts, kernel: rwkv7(*ts, kernel=kernel, chunk_size=8, output_final_state=True),
              lambda: list(rwkv7_inputs(1).values())),
    "titans": (lambda ts, kernel: titans_memory(*ts[:6], ts[6:], kernel=kernel, chunk_size=4,
                                                grad_clip=None, output_final_state=True),
               lambda: [*titans_inputs(2)[0].values(), *titans_inputs(2)[1]]),
    "dual_delta_rule": (lambda ts, kernel: dual_delta_rule(
                            *ts[:3], torch.cat([ts[3], ts[3].flip(-1)], -1),
                            torch.cat([ts[4], 0.5 * ts[4]], -1), kernel=kernel, chunk_size=8,
                            output_final_state=True),
                        lambda: list(delta_inputs(3).values())),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_auto_on_the_cpu_computes_what_the_torch_form_computes(op):
    run, inputs = OPS[op]
    tensors = inputs()
    got = outputs_and_grads(lambda ts: run(ts, "auto"), tensors)
    want = outputs_and_grads(lambda ts: run(ts, "torch"), tensors)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), op
    assert {c["impl"] for c in auto.chosen()} == {"torch"}
    assert {c["op"] for c in auto.chosen()} == {op}


def test_the_one_token_forms_take_auto():
    x = {name: t[:, 0] for name, t in delta_inputs(4).items()}
    got = delta_rule_module.delta_rule_one_token(*x.values(), None, kernel="auto")
    want = delta_rule_module.delta_rule_one_token(*x.values(), None, kernel="torch")
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("depth, chunk, clip, dtype, expected", [
    (1, 16, 1.0, torch.float32, ("triton",)),
    (1, 1, None, torch.bfloat16, ("fla", "torch")),
    (1, 1, None, torch.float32, ("torch",)),     # fla refuses float32
    (1, 1, 1.0, torch.bfloat16, ("torch",)),     # fla has no clipping
    (2, 16, None, torch.bfloat16, ("triton",)),  # the two-layer kernel
    (2, 64, None, torch.bfloat16, ("torch",)),   # ... takes chunk_size 16 or 32 only
    (3, 16, None, torch.bfloat16, ("torch",)),   # nothing but torch runs three layers
    (1, 8, None, torch.bfloat16, ("torch",)),
])
def test_titans_offers_only_the_implementations_computing_its_function(depth, chunk, clip, dtype,
                                                                       expected):
    weights = [torch.zeros(2, 4, 4)] * depth
    assert titans_module._auto_candidates(weights, chunk, clip, dtype) == expected


@pytest.mark.parametrize("gated, expected", [(True, ("triton", "fla")), (False, ("triton",))])
def test_the_delta_rule_offers_fla_only_with_a_gate(gated, expected, monkeypatch):
    seen = []
    monkeypatch.setattr(delta_rule_module, "choose",
                        lambda *args, candidates: seen.append(candidates) or "torch")
    x = delta_inputs(5)
    delta_rule(*x.values() if gated else [*list(x.values())[:4], None], kernel="auto",
               chunk_size=8)
    assert seen == [expected]
