"""The latent study alone, from a params file (its `data` and `study` sections):

    python -m ltm.study [--params params.yaml] [--out reports/results/study.json] [--no-progress]

The study stage runs the same (ltm.stages.study.study_stage); this is for another profile, e.g.
configs/gpu-study.yaml on a GPU. Prints the verdict; the metrics go to --out.
"""
from __future__ import annotations

import argparse

from ltm.data.corpus import DataError
from ltm.params import ParamsError
from ltm.study.run import study_from_params


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The latent study (ltm.study) from a params file.")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="reports/results/study.json")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        metrics = study_from_params(args.params, args.out, not args.no_progress)
    except (ParamsError, DataError) as err:
        raise SystemExit(f"error: {err}") from None
    print("\n".join(metrics.get("verdict") or ["latent study: off (study.enabled false)"]))


if __name__ == "__main__":
    main()
