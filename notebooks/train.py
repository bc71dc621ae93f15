# %% [markdown]
# # Train
# Trains the model of `params.yaml` (`model:`) with the loop and speed switches of `train:` on the
# token cache. Checkpoints go to `data/checkpoints/`; with `train.resume: true` a killed run
# continues from the last one when its configuration matches.

# %% tags=["parameters"]
params_path = "params.yaml"

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd

from ltm.report import loss_figure
from ltm.train import train_stage

result = train_stage(params_path)
pd.Series(result.metrics, name="value").to_frame()

# %%
loss_figure(pd.DataFrame(result.history))
