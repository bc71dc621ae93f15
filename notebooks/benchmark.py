# %% [markdown]
# # Benchmark
# Times, on the device that runs the stage: each token mixer's naive token loop against its
# chunked form (and SDPA attention), cached against uncached generation, and the recurrence
# kernels (token loop, torch chunk, Triton and fla where they run). `speedup` is the time of the
# slow original of the same group over this row's time. Only this run's measurements are metrics;
# the GPU records kept in git are shown by the report as history.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = None
plot_path = None
plot_dir = None
summary_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from IPython.display import display
import pandas as pd

from ltm.stages.benchmark import benchmark_stage
from ltm.report.figures import benchmark_figures
from ltm.pipeline import stage_paths

paths = stage_paths("benchmark", metrics_path=metrics_path, plot_path=plot_path,
                    plot_dir=plot_dir)
table, metrics = benchmark_stage(params_path, **paths)
display(pd.json_normalize(metrics, sep=" / ").T.rename(columns={0: "value"}))
# the columns every row has; the rest (per-group detail) are in reports/plots/benchmark.csv
table[["group", "case", "impl", "ms", "speedup"]].round(3)

# %%
for figure in benchmark_figures(table):
    display(figure)

# %% [markdown]
# ## The stage's headline metrics
# What `dvc metrics diff` and `dvc exp show` compare (reports/metrics/benchmark.json).

# %%
from ltm.stages.summary import benchmark_summary, write_summary

summary_paths = stage_paths("benchmark", summary_path=summary_path)
summary = write_summary(summary_paths["summary_path"], benchmark_summary(metrics))
pd.json_normalize(summary, sep=" / ").T.rename(columns={0: "value"})
