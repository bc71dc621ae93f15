"""`dvc plots diff`, drawn offline: one HTML page of static SVG charts.

DVC's own page loads the Vega libraries from the internet and is blank without it. This asks DVC
for the same charts as Vega-Lite specifications (`dvc plots diff --json`, data inlined) and draws
each to SVG with vl-convert, which carries the Vega libraries inside its wheel:

    python -m ltm.report.plots                  # the workspace against HEAD
    python -m ltm.report.plots HEAD~3 HEAD      # any revisions, as dvc plots diff takes them
"""
from __future__ import annotations

import argparse
import html
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_OUT = Path("reports") / "plots_diff.html"


def plot_specs(revisions: list[str]) -> tuple[dict[str, list[dict]], list[dict]]:
    """{plot name: [Vega-Lite spec, ...]} and DVC's errors, from `dvc plots diff --json`."""
    done = subprocess.run([sys.executable, "-m", "dvc", "plots", "diff", "--json", *revisions],
                          capture_output=True, text=True)
    try:
        found = json.loads(done.stdout)
    except ValueError:
        message = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"dvc plots diff failed: {message}") from None
    specs = {name: [entry["content"] for entry in entries if entry.get("type") == "vega"]
             for name, entries in (found.get("data") or {}).items()}
    return specs, found.get("errors") or []


def render_page(specs: dict[str, list[dict]], errors: list[dict], title: str) -> str:
    """The charts as inline SVG (no script, no font or file from elsewhere)."""
    import vl_convert  # imported here: only this command needs it

    parts = [f"<h1>{html.escape(title)}</h1>"]
    for name, contents in specs.items():
        parts.append(f"<h2>{html.escape(name)}</h2>")
        for spec in contents:
            # DVC's inputs (a smoothing slider, hover rules) have no use in a static picture and
            # are left inert; the data and axes are drawn as DVC defines them
            parts.append(vl_convert.vegalite_to_svg(spec))
    for error in errors:
        parts.append(f"<p class=error>{html.escape(error.get('name', error.get('rev', '')))}: "
                     f"{html.escape(str(error.get('msg', '')).splitlines()[0])}</p>")
    style = "body{font-family:sans-serif;margin:2em}svg{margin:0.5em}.error{color:#a00}"
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="*", help="as for dvc plots diff (default: HEAD)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        specs, errors = plot_specs(args.revisions)
    except RuntimeError as err:
        print(f"ltm.report.plots: {err}", file=sys.stderr)
        return 1
    compared = " vs ".join(args.revisions) or "workspace vs HEAD"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_page(specs, errors, f"dvc plots diff: {compared}"))
    print(f"ltm.report.plots: {sum(map(len, specs.values()))} charts in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
