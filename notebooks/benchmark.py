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
checkpoint_dir = None
prior_metrics_path = None
summary_path = None
prior_plot_path = None

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
# ## The learned prior over latent thoughts
# Its samplers (1000-step DDPM, DPM-Solver++ at few evaluations) against z ~ N(0, I) and the plain
# LM, on the train stage's models: time per z, distance to held-out posteriors, and the text
# generated from those z scored by the plain LM (ltm/bench/prior.py states the estimators).

# %%
from ltm.stages.benchmark import prior_benchmark

prior_paths = stage_paths("benchmark", checkpoint_dir=checkpoint_dir,
                          prior_metrics_path=prior_metrics_path, prior_plot_path=prior_plot_path)
prior_table, prior_metrics = prior_benchmark(
    params_path, prior_paths["checkpoint_dir"], metrics_path=prior_paths["prior_metrics_path"],
    plot_path=prior_paths["prior_plot_path"])
display(pd.Series({k: v for k, v in prior_metrics.items() if not isinstance(v, (dict, list))},
                  name="value").to_frame())
prior_table.round(3)

# %% [markdown]
# ## The stage's headline metrics
# What `dvc metrics diff` and `dvc exp show` compare (reports/metrics/benchmark.json).

# %%
from ltm.stages.summary import benchmark_summary, write_summary

summary_paths = stage_paths("benchmark", summary_path=summary_path)
summary = write_summary(summary_paths["summary_path"], benchmark_summary(metrics, prior_metrics))
pd.json_normalize(summary, sep=" / ").T.rename(columns={0: "value"})
