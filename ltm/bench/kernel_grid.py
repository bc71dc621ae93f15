"""The kernel grid's tables (gpu/kernel_grid.py measures the grid; `ltm.records` reads its
records for the report): ours and fla side by side per op, shape and pass, their text form, and
per op and pass the geometric mean and the worst ratio to fla, with the worst shape.
"""
from __future__ import annotations

import math


def grid_table(rows: list[dict]) -> list[dict]:
    """One row per (op, shape, pass) with ours and fla side by side: ms, x_fla (fla's time over
    ours: above 1, ours is faster) and both times over the floor of `floor_counts`."""
    by_key: dict[tuple, dict] = {}
    for r in rows:
        if r["impl"] not in ("triton", "fla"):
            continue
        key = (r["op"], r["B"], r["T"], r["H"], r["D"], r["pass"])
        row = by_key.setdefault(key, {"op": r["op"], "B": r["B"], "T": r["T"], "H": r["H"],
                                      "D": r["D"], "pass": r["pass"], "floor_ms": r["floor_ms"]})
        name = "ours" if r["impl"] == "triton" else "fla"
        row[f"{name}_ms"], row[f"{name}_x_floor"] = r["ms"], r.get("x_floor")
        if r["ms"] is None:
            row[f"{name}_error"] = r.get("error")
    for row in by_key.values():
        ours, fla = row.get("ours_ms"), row.get("fla_ms")
        row["x_fla"] = fla / ours if ours and fla else None
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
    `ltm.records.latest_grid`) where rows have it."""
    groups: dict[tuple, dict] = {}
    for r in table:
        g = groups.setdefault((r["op"], r["pass"]), {"op": r["op"], "pass": r["pass"], "shapes": 0,
                                                      "ratios": [], "graph": [], "floors": []})
        g["shapes"] += 1
        shape = f"{r['B']},{r['T']},{r['H']},{r['D']}"
        if r.get("ours_x_floor") is not None:
            g["floors"].append(r["ours_x_floor"])
        if r["x_fla"]:
            g["ratios"].append((r["x_fla"], shape))
        if r.get("x_fla_graph"):
            g["graph"].append((r["x_fla_graph"], shape))
    out = []
    for g in groups.values():
        ratios, graph, floors = g.pop("ratios"), g.pop("graph"), g.pop("floors")
        worst, at = min(ratios) if ratios else (None, None)
        row = {**g, "with_fla": len(ratios),
               "geomean_x_fla": geomean([x for x, _ in ratios]) if ratios else None,
               "worst_x_fla": worst, "worst_shape": at, "worst_ours_x_floor": max(floors, default=None)}
        if graph:
            row["geomean_x_fla_graph"], (row["worst_x_fla_graph"], row["worst_shape_graph"]) = (
                geomean([x for x, _ in graph]), min(graph))
        out.append(row)
    return out


def geomean(values: list[float]) -> float:
    """The geometric mean of positive values (the grid's ratios; gpu/kernel_grid.py too)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))
