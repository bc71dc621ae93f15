"""The measured tables of `model.kernel: auto` (ltm/ops/auto.py), one JSON file per device; a
package so that a wheel carries them (pyproject.toml's package-data)."""
