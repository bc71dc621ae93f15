# %% [markdown]
# # Recall against distance
# Multi-query associative recall (ltm/data/recall.py): key-value pairs written through a sequence,
# each key queried once later. Every mixer of `recall.mixers` is trained here on the same batches
# at (nearly) equal parameters, once per training seed; accuracy on held-out answers by how far
# back the pair was written, averaged over the seeds, its standard error holding their spread and
# the evaluation's sampling (ltm/bench/recall.py). A stage of its own: it reads no checkpoint, so
# an experiment on the trained model never retrains these models.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = None
plot_path = None
summary_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd
from IPython.display import display

from ltm.pipeline import stage_paths
from ltm.report.recall_figure import recall_figure
from ltm.stages.recall import recall_benchmark
from ltm.stages.summary import recall_summary, write_summary

paths = stage_paths("recall", metrics_path=metrics_path, plot_path=plot_path,
                    summary_path=summary_path)
recall_table, recall_curve, recall_metrics = recall_benchmark(
    params_path, paths["metrics_path"], paths["plot_path"])
write_summary(paths["summary_path"], recall_summary(recall_metrics))
display(pd.Series({k: v for k, v in recall_metrics.items() if not isinstance(v, (dict, list))},
                  name="value").to_frame())
if recall_metrics["enabled"]:
    display(recall_figure(recall_table, recall_metrics, recall_curve))
    display(pd.DataFrame(recall_metrics["margins_over_sliding_window"]).T)
recall_table.round(3)
