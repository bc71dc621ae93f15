# %% [markdown]
# # Ablate: what each speed switch buys
# The baseline is the `model` and `train` sections of `params.yaml`. Every entry of
# `ablate.switches` is flipped alone on top of it and trained for `ablate.steps` steps; the table
# shows tokens/s relative to the baseline and the validation loss after the same steps.

# %% tags=["parameters"]
params_path = "params.yaml"

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from ltm.ablate import ablate_stage

table = ablate_stage(params_path)
table

# %%
from ltm.report import ablate_figure

ablate_figure(table)
