# %% [markdown]
# # Ablate: what each speed switch buys
# The baseline is the `model` and `train` sections of `params.yaml`. Every entry of
# `ablate.switches` is flipped alone on top of it and trained for `ablate.steps` steps; the table
# shows tokens/s relative to the baseline and the validation loss after the same steps.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = plot_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from ltm.ablate import ablate_stage
from ltm.pipeline import stage_paths

paths = stage_paths("ablate", metrics_path=metrics_path, plot_path=plot_path)
table = ablate_stage(params_path, **paths)
table

# %%
from ltm.figures import ablate_figure

ablate_figure(table)
