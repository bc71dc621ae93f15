# %% [markdown]
# # Train
# Trains the model of `params.yaml` (`model:`) with the loop and speed switches of `train:` on the
# token cache. Checkpoints go to the folder dvc.yaml names; with `train.resume: true` a killed run
# continues from the last one when its configuration and data match.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
checkpoint_dir = metrics_path = plot_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd

from ltm.figures import loss_figure
from ltm.pipeline import stage_paths
from ltm.train import train_stage

paths = stage_paths("train", checkpoint_dir=checkpoint_dir, metrics_path=metrics_path,
                    plot_path=plot_path)
result = train_stage(params_path, **paths)
pd.Series(result.metrics, name="value").to_frame()

# %%
loss_figure(pd.DataFrame(result.history))
