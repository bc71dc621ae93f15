# %% [markdown]
# # Benchmark
# Times, on the device that runs the stage: each token mixer's naive token loop against its
# chunked form (and SDPA attention), cached against uncached generation, and the recurrence
# kernels (token loop, torch chunk, Triton and fla where they run). `speedup` is the time of the
# slow original of the same group over this row's time.

# %% tags=["parameters"]
params_path = "params.yaml"

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import json
from pathlib import Path

from ltm.bench.stage import benchmark_stage
from ltm.report import benchmark_figures

table = benchmark_stage(params_path)
print(json.dumps(json.loads(Path("reports/metrics/benchmark.json").read_text()), indent=1))
table

# %%
for figure in benchmark_figures(table):
    display(figure)
