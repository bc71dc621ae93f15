"""The kernel grid's tables (gpu/kernel_grid.py measures the grid; `ltm.report.records` reads its
records for the report): ours and fla side by side per op, shape and pass, their text form, and
per op and pass the geometric mean and the worst ratio to fla, with the worst shape; and what
gpu/kernel_grid.py writes from its measured rows (their summary, their text, the rows in
`ltm.bench.kernels`' format).
"""
from __future__ import annotations

import math


def grid_table(rows: list[dict]) -> list[dict]:
    """One row per (op, shape, pass) with ours and fla side by side: ms, x_fla (fla's time over
    ours: above 1, ours is faster) and both times over the floor of `floor_counts`. fla is the
    fastest fla path the run timed (fla_ref names it and the backends it ran, where the record
    says); where the run also timed fla's Triton path apart from faster backends, fla_triton_ms
    and x_fla_triton give ours against that path alone."""
    by_key: dict[tuple, dict] = {}
    for r in rows:
        if r["impl"] not in ("triton", "fla", "fla_triton"):
            continue
        key = (r["op"], r["B"], r["T"], r["H"], r["D"], r["pass"])
        row = by_key.setdefault(key, {"op": r["op"], "B": r["B"], "T": r["T"], "H": r["H"],
                                      "D": r["D"], "pass": r["pass"], "floor_ms": r["floor_ms"]})
        name = {"triton": "ours"}.get(r["impl"], r["impl"])
        row[f"{name}_ms"], row[f"{name}_x_floor"] = r["ms"], r.get("x_floor")
        if r.get("ref"):
            row[f"{name}_ref"] = r["ref"]
        if r["ms"] is None:
            row[f"{name}_error"] = r.get("error")
    for row in by_key.values():
        ours, fla, triton_path = row.get("ours_ms"), row.get("fla_ms"), row.get("fla_triton_ms")
        row["x_fla"] = fla / ours if ours and fla else None
        if "fla_triton_ms" in row:
            row["x_fla_triton"] = triton_path / ours if ours and triton_path else None
    return list(by_key.values())


def format_grid(table: list[dict]) -> str:
    """`grid_table` as text, with the geometric mean and the worst x_fla per op and pass."""
    lines = [f"{'op':17} {'B,T,H,D':17} {'pass':8} {'ours ms':>9} {'fla ms':>9} {'x_fla':>6} "
             f"{'ours/floor':>10} {'fla/floor':>9}"]
    f = lambda v, spec: format(v, spec) if v is not None else "-"
    for r in table:
        shape = f"{r['B']},{r['T']},{r['H']},{r['D']}"
        lines.append(f"{r['op']:17} {shape:17} {r['pass']:8} {f(r.get('ours_ms'), '9.3f'):>9} "
                     f"{f(r.get('fla_ms'), '9.3f'):>9} {f(r['x_fla'], '.2f'):>6} "
                     f"{f(r.get('ours_x_floor'), '.1f'):>10} {f(r.get('fla_x_floor'), '.1f'):>9}")
    for s in grid_summary(table):
        if s["with_fla"]:
            lines.append(f"{s['op']} {s['pass']}: {s['with_fla']} shapes, geometric mean x_fla "
                         f"{s['geomean_x_fla']:.2f}, worst {s['worst_x_fla']:.2f} at {s['worst_shape']}")
    return "\n".join(lines)


def grid_summary(table: list[dict]) -> list[dict]:
    """Per op and pass of `grid_table` rows: the shapes, how many have an fla time, the geometric
    mean and the worst x_fla with its shape (None without fla times), and the worst ratio of
    ours to the floor; the same two from x_fla_graph (CUDA-graph GPU times,
    `ltm.report.records.latest_grid`) where rows have it."""
    groups: dict[tuple, dict] = {}
    for r in table:
        g = groups.setdefault((r["op"], r["pass"]), {"op": r["op"], "pass": r["pass"], "shapes": 0,
                                                      "ratios": [], "graph": [], "floors": [],
                                                      "triton_path": []})
        g["shapes"] += 1
        shape = f"{r['B']},{r['T']},{r['H']},{r['D']}"
        if r.get("ours_x_floor") is not None:
            g["floors"].append(r["ours_x_floor"])
        if r["x_fla"]:
            g["ratios"].append((r["x_fla"], shape))
        if r.get("x_fla_graph"):
            g["graph"].append((r["x_fla_graph"], shape))
        if r.get("x_fla_triton"):
            g["triton_path"].append((r["x_fla_triton"], shape))
    out = []
    for g in groups.values():
        ratios, graph, floors = g.pop("ratios"), g.pop("graph"), g.pop("floors")
        triton_path = g.pop("triton_path")
        worst, at = min(ratios) if ratios else (None, None)
        row = {**g, "with_fla": len(ratios),
               "geomean_x_fla": geomean([x for x, _ in ratios]) if ratios else None,
               "worst_x_fla": worst, "worst_shape": at, "worst_ours_x_floor": max(floors, default=None)}
        if graph:
            row["geomean_x_fla_graph"], (row["worst_x_fla_graph"], row["worst_shape_graph"]) = (
                geomean([x for x, _ in graph]), min(graph))
        if triton_path:
            row["geomean_x_fla_triton"], (row["worst_x_fla_triton"], row["worst_shape_triton"]) = (
                geomean([x for x, _ in triton_path]), min(triton_path))
        out.append(row)
    return out


def geomean(values: list[float]) -> float:
    """The geometric mean of positive values (the grid's ratios)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def as_bench_rows(rows: list) -> list:
    """gpu/kernel_grid.py's grid rows as `python -m ltm.bench.kernels` records them (one row per op, impl, shape
    and pass, impl "triton" for ours), so that records/bench keeps one format and the report's
    kernel history (`ltm.report.records.recorded_kernel_rows`) reads these files too. impl "fla"
    is the fastest fla path timed ("ref": which, with the backends it ran); where the run timed
    faster paths beside it, fla's Triton path also gets rows of its own (impl "fla_triton")."""
    out = []
    for r in rows:
        if r.get("section") != "grid" or "skipped" in r:
            continue
        B, T, H, D = r["shape"]
        impls = [("ours", "triton"), ("fla", "fla")]
        if len(r.get("references", ())) > 1 and "fla_triton" in r["references"]:
            impls.append(("fla_triton", "fla_triton"))
        for name, impl in impls:
            for p, pass_ in (("fwd", "fwd"), ("fb", "fwd+bwd")):
                ms = r.get(f"{name}_{p}")
                row = {"op": r["op"], "impl": impl, "B": B, "T": T, "H": H, "D": D,
                       "dtype": "bfloat16", "pass": pass_, "ms": ms, "floor_ms": r[f"floor_{p}"],
                       "x_floor": ms / r[f"floor_{p}"] if ms else None,
                       "x_fla": (r.get(f"fla_{p}") / ms) if ms and r.get(f"fla_{p}") else None,
                       "first_s": r.get(f"{name}_{p}_first_s")}
                ref = r.get(f"fla_{p}_ref") if name == "fla" else r.get(f"{name}_{p}_backend")
                if ref:
                    row["ref"] = ref if name == "fla" else f"{name} ({ref})"
                if ms is None:
                    row["error"] = r.get(f"{name}_{p}_error") or r.get(f"{name}_error")
                out.append(row)
    return out


def run_summary(rows: list) -> dict:
    """Per op and pass over gpu/kernel_grid.py's grid rows that have them: geometric mean and worst x_fla (with its
    shape), the worst ratio to the floor, and the geometric mean of what tuning bought."""
    out = {}
    grid = [r for r in rows if r.get("section") == "grid" and "skipped" not in r]
    for op in sorted({r["op"] for r in grid}):
        for p in ("fwd", "fb"):
            mine = [r for r in grid if r["op"] == op]
            pairs = [(r[f"x_fla_{p}"], r["shape"]) for r in mine if r.get(f"x_fla_{p}")]
            entry = {"n": len(pairs)}
            if pairs:
                worst = min(pairs)
                entry.update(geomean_x_fla=geomean([v for v, _ in pairs]), worst_x_fla=worst[0],
                             worst_shape=worst[1])
            floors = [(r[f"x_floor_{p}"], r["shape"]) for r in mine if r.get(f"x_floor_{p}")]
            if floors:
                entry["worst_x_floor"], entry["worst_floor_shape"] = max(floors)
            graphed = [(r[f"x_fla_{p}_graph"], r["shape"]) for r in mine if r.get(f"x_fla_{p}_graph")]
            if graphed:
                worst = min(graphed)
                entry.update(geomean_x_fla_graph=geomean([v for v, _ in graphed]),
                             worst_x_fla_graph=worst[0], worst_shape_graph=worst[1])
            triton_path = [(r[f"x_fla_triton_{p}"], r["shape"]) for r in mine
                           if r.get(f"x_fla_triton_{p}") and len(r.get("references", ())) > 1]
            if triton_path:
                worst = min(triton_path)
                entry.update(geomean_x_fla_triton=geomean([v for v, _ in triton_path]),
                             worst_x_fla_triton=worst[0], worst_shape_triton=worst[1])
            gains = [r[f"tuned_gain_{p}"] for r in mine if r.get(f"tuned_gain_{p}")]
            if gains:
                entry["geomean_tuned_gain"], entry["min_tuned_gain"] = geomean(gains), min(gains)
            out[f"{op}_{p}"] = entry
    return out


def _fmt(v, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def format_run(rows: list) -> str:
    """gpu/kernel_grid.py's rows as text: the grid, the decode steps, the summary, the CUDA-graph times."""
    lines = [f"{'op':17} {'B,T,H,D':16} {'ours fwd':>9} {'fla fwd':>8} {'x_fla':>6} {'ours fb':>8} "
             f"{'fla fb':>8} {'x_fla':>6} {'x_floor f/fb':>12} {'tuned gain':>10}  fla path fwd / fb"]
    for r in rows:
        if r.get("section") != "grid" or "skipped" in r:
            continue
        lines.append(f"{r['op']:17} {','.join(map(str, r['shape'])):16} {_fmt(r.get('ours_fwd')):>9} "
                     f"{_fmt(r.get('fla_fwd')):>8} {_fmt(r.get('x_fla_fwd'), '.2f'):>6} "
                     f"{_fmt(r.get('ours_fb')):>8} {_fmt(r.get('fla_fb')):>8} "
                     f"{_fmt(r.get('x_fla_fb'), '.2f'):>6} "
                     f"{_fmt(r.get('x_floor_fwd'), '.1f') + '/' + _fmt(r.get('x_floor_fb'), '.1f'):>12} "
                     f"{_fmt(r.get('tuned_gain_fb'), '.2f'):>10}  "
                     f"{r.get('fla_fwd_ref', '-')} / {r.get('fla_fb_ref', '-')}")
    skipped = [r for r in rows if r.get("section") == "grid" and "skipped" in r]
    if skipped:
        lines.append(f"skipped (budget): {len(skipped)} (op, shape) pairs")
    dec = [r for r in rows if r.get("section") == "decode" and "op" in r]
    if dec:
        lines.append("decode step (ms): triton / torch, floor")
        for r in dec:
            lines.append(f"  {r['op']:17} B={r['B']:<3} H={r['H']:<3} D={r['D']:<4} "
                         f"{_fmt(r.get('triton_ms'), '.4f')} / {_fmt(r.get('torch_ms'), '.4f')} "
                         f"x{_fmt(r.get('speedup'), '.1f')} floor {_fmt(r.get('floor_ms'), '.4f')}")
    for key, s in run_summary(rows).items():
        if s["n"]:
            lines.append(f"{key}: {s['n']} shapes, geomean x_fla {s['geomean_x_fla']:.2f}, worst "
                         f"{s['worst_x_fla']:.2f} at {','.join(map(str, s['worst_shape']))}; worst "
                         f"x_floor {_fmt(s.get('worst_x_floor'), '.1f')}; tuned gain geomean "
                         f"{_fmt(s.get('geomean_tuned_gain'), '.2f')} (min {_fmt(s.get('min_tuned_gain'), '.2f')})")
            if "geomean_x_fla_triton" in s:
                lines.append(f"{key} against fla's Triton path alone: geomean "
                             f"{s['geomean_x_fla_triton']:.2f}, worst {s['worst_x_fla_triton']:.2f} at "
                             f"{','.join(map(str, s['worst_shape_triton']))}")
            if "geomean_x_fla_graph" in s:
                lines.append(f"{key} (CUDA graph, GPU time): geomean x_fla {s['geomean_x_fla_graph']:.2f}, "
                             f"worst {s['worst_x_fla_graph']:.2f} at "
                             f"{','.join(map(str, s['worst_shape_graph']))}")
    graphed = [r for r in rows if r.get("section") == "grid" and r.get("ours_fwd_graph")]
    if graphed:
        lines.append("CUDA graph ms (ours / fla, x_fla; fwd, fb), x_floor fwd:")
        for r in graphed:
            lines.append(f"  {r['op']:17} {','.join(map(str, r['shape'])):16} "
                         f"{_fmt(r.get('ours_fwd_graph'))} / {_fmt(r.get('fla_fwd_graph'))} "
                         f"x{_fmt(r.get('x_fla_fwd_graph'), '.2f')}  {_fmt(r.get('ours_fb_graph'))} / "
                         f"{_fmt(r.get('fla_fb_graph'))} x{_fmt(r.get('x_fla_fb_graph'), '.2f')}  "
                         f"{_fmt(r.get('x_floor_fwd_graph'), '.1f')}")
    return "\n".join(lines)
