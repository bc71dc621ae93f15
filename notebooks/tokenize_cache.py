# %% [markdown]
# # Tokenize cache
# Reads the corpus named in `params.yaml` (`data:`), trains the byte-level BPE tokenizer on the
# train split, writes the memmapped token shards and their checksums to `data.cache_dir`. With
# `data.source: synthetic` it draws the Markov-chain sequences instead (one window a sequence) and
# the metrics hold the exact entropies per token of the validation split (`exact_val_*`).
# (Named `tokenize_cache`, not `tokenize`, so that it never shadows Python's `tokenize` module.)

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = None
summary_path = None

# %%
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd

from ltm.pipeline import stage_paths
from ltm.stages.summary import tokenize_summary, write_summary
from ltm.stages.tokenize import tokenize_stage

paths = stage_paths("tokenize", metrics_path=metrics_path, summary_path=summary_path)
metrics, splits = tokenize_stage(params_path, paths["metrics_path"])
summary = write_summary(paths["summary_path"], tokenize_summary(metrics))
pd.Series(summary, name="value").to_frame()

# %% [markdown]
# Documents and works per split (the split is by work, fixed by `data.seed`: editions of one
# work stay on one side; synthetic: sequences).

# %%
splits
