# %% [markdown]
# # Train
# Trains the model of `params.yaml` (`model:`) with the loop and speed switches of `train:` on the
# token cache. Checkpoints go to `data/checkpoints/`; with `train.resume: true` a killed run
# continues from the last one when its configuration matches.

# %% tags=["parameters"]
params_path = "params.yaml"

# %%
import pandas as pd

from ltm.report import loss_figure
from ltm.train import train_stage

result = train_stage(params_path)
pd.Series(result.metrics, name="value").to_frame()

# %%
loss_figure(pd.DataFrame(result.history));
