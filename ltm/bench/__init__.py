"""Benchmarks of the workbook: each module measures one thing and returns rows for the benchmark stage."""
