# %% [markdown]
# # Ablate: the roadmap's protocol
# Start from the trained model (the train stage's checkpoint), make one change from
# `ablate.switches`, rerun the quick test, and keep the change only if the validation loss on a
# fixed set stays within the switch's tolerance and the step time drops beyond the spread of the
# repeats (PASS); FAIL, SLOWER and NO EFFECT changes are dropped. In `cumulative` mode each PASS
# is the baseline of the rows after it. The profile splits a step of the baseline and of the
# final configuration by operation group.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = None
summary_path = None
plot_path = None
checkpoint_dir = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd
from IPython.display import display

from ltm.pipeline import stage_paths
from ltm.stages.ablate import ablate_stage
from ltm.stages.summary import ablate_summary, read_results, write_summary

paths = stage_paths("ablate", metrics_path=metrics_path, plot_path=plot_path,
                    checkpoint_dir=checkpoint_dir,  # the train stage's checkpoints: the baseline
                    summary_path=summary_path)
summary_path = paths.pop("summary_path")
result = ablate_stage(params_path, **paths)
# the headline metrics that `dvc metrics diff` compares: each change's verdict and speed-up
write_summary(summary_path, ablate_summary(read_results(paths["metrics_path"])))
# the protocol's settings (every line above went to the terminal too: one per change tried)
display(pd.Series({k: str(v) for k, v in result.info.items()}, name="value").to_frame())
result.table

# %%
from ltm.report.figures import ablate_figure, profile_figure

ablate_figure(result.table)

# %%
result.profile.pivot(index="group", columns="config", values="ms").round(2)

# %%
profile_figure(result.profile)
