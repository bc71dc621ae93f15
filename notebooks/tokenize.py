# %% [markdown]
# # Tokenize cache
# Reads the corpus named in `params.yaml` (`data:`), trains the byte-level BPE tokenizer on the
# train split, writes the memmapped token shards and their checksums to `data/cache/`.

# %% tags=["parameters"]
params_path = "params.yaml"
metrics_path = "reports/metrics/tokenize.json"

# %%
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd

from ltm.cache import read_meta, tokenize_stage

metrics = tokenize_stage(params_path, metrics_path)
pd.Series(metrics, name="value").to_frame()

# %% [markdown]
# Documents per split (the split is by document, fixed by `data.seed`).

# %%
meta = read_meta("data/cache")
pd.DataFrame([{"split": s, "documents": m["documents"], "bytes": m["bytes"], "tokens": m["tokens"],
               "shards": len(m["shards"])} for s, m in meta["splits"].items()])
