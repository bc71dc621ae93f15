"""The study stage: do latent thoughts carry information? The latent study of params.yaml's
`study` section (ltm.study) on the testbed of data.synthetic and on the token cache, with its
controls; its results and headline metrics. A stage of its own, so that an experiment on the
trained model never reruns it, and one on the study reruns nothing else but the report.
"""
from __future__ import annotations

from pathlib import Path

from ltm.stages.summary import study_summary, write_summary
from ltm.study.run import study_from_params


def study_stage(params_path: str | Path, metrics_path: str | Path,
                summary_path: str | Path | None = None, progress: bool = True,
                say=print) -> dict:
    """The study of the `study` section; its metrics to metrics_path and, when given, its
    headline (the latent model's gains over the parameter-matched plain model and over another
    sequence's z, per source) to summary_path. Returns the metrics."""
    study = study_from_params(params_path, metrics_path, progress, say)
    if summary_path is not None:
        write_summary(summary_path, study_summary(study))
    return study
