"""Every measurement of the workbook, timed by one helper (`ltm.bench.timing`).

Two kinds of module live here. The stages' benchmarks (`kernels`, `kernel_grid`, `latent`,
`model`, `prior` for the benchmark stage, `recall` for the recall stage) each measure one thing
and return rows for their stage. The GPU measurement commands (`python -m ltm.bench.<name>`, or
the thin commands gpu/kernel_grid.py and gpu/levers_bench.py; gpu/README.md lists them all) time
the GPU profile's kernels, layers and training steps and write the JSON records that records/
keeps; `references` (fla as users install it) and `provenance` (commit and versions) serve them.
"""
