# %% [markdown]
# # Report
# Collects the metrics and plot data of every stage into one HTML page (tables and figures
# embedded), with the commit, versions and device they came from, and the GPU records kept in git
# as history.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_dir = None
results_dir = None
plots_dir = None
bench_records = None
gpu_records = None
samples_path = None
output = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from IPython.display import Markdown, display

from ltm.pipeline import stage_paths
from ltm.stages.report import report_stage

paths = stage_paths("report", metrics_dir=metrics_dir, results_dir=results_dir, plots_dir=plots_dir,
                    bench_records=bench_records, gpu_records=gpu_records,
                    samples_path=samples_path, output=output)
sections = report_stage(params_path, **paths)
for section in sections:
    display(Markdown(f"## {section.title}\n\n{section.note or ''}"))
    for figure in section.figures:
        display(figure)
    for table in section.tables:
        display(table)
