# %% [markdown]
# # Train
# Trains the model of `params.yaml` (`model:`) with the loop and speed switches of `train:` on the
# token cache. Checkpoints go to the folder dvc.yaml names; with `train.resume: true` a killed run
# continues from the last one when its configuration and data match. With `train.counterpart`
# it then trains the other kind of model (latent beside plain, plain beside latent) at equal
# training tokens and a plain model at equal training FLOPs, and compares them below.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
checkpoint_dir = None
metrics_path = None
plot_path = None
samples_path = None
prior_metrics_path = None
prior_bench_path = None
prior_plot_path = None
summary_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
import pandas as pd

from ltm.report.figures import loss_figure
from ltm.pipeline import stage_paths
from ltm.stages.train import train_stage

paths = stage_paths("train", checkpoint_dir=checkpoint_dir, metrics_path=metrics_path,
                    plot_path=plot_path, samples_path=samples_path)
samples_path = paths.pop("samples_path")
prior_paths = stage_paths("train", prior_metrics_path=prior_metrics_path,
                          prior_bench_path=prior_bench_path, prior_plot_path=prior_plot_path)
# a summary line per trained model rather than progress bars, which a stored notebook keeps
# every update of; the prior (below) trains as soon as the latent model is trained
result = train_stage(params_path, **paths, progress=False,
                     prior_metrics_path=prior_paths["prior_metrics_path"])
headline = {k: v for k, v in result.metrics.items() if not isinstance(v, (dict, list))}
pd.Series(headline, name="value").to_frame()

# %%
loss_figure(pd.DataFrame(result.history))

# %% [markdown]
# ## Latent against plain
# One row per model (a latent model's val_loss is its NELBO bound, a plain one's its NLL; the
# suffix NLL given the prefix compares them), then the latent model by inference steps.

# %%
from IPython.display import Markdown, display

from ltm.report.figures import latent_by_steps, latent_figure

comparison = pd.DataFrame(result.metrics.get("comparison") or [])
latent = result.metrics.get("latent_model") or {}
if not comparison.empty:
    display(comparison)
if latent.get("val_nelbo_by_steps"):
    display(Markdown(latent.get("note", "")))
    display(latent_figure(latent_by_steps(latent), comparison if not comparison.empty else None,
                          pd.DataFrame(result.compared) if result.compared else None))

# %% [markdown]
# ## A learned prior over latent thoughts
# A small diffusion model over z, trained on posterior samples of the latent model (params.yaml
# `prior:`, ltm/latent/prior.py) as soon as the train stage above had trained that model, then its
# samplers against N(0, I) and the plain LM (`prior.bench`).

# %%
from ltm.stages.prior import prior_benchmark, read_prior_metrics

prior_metrics = read_prior_metrics(prior_paths["prior_metrics_path"])
pd.Series({k: v for k, v in prior_metrics.items() if k != "curve"}, name="value").to_frame()

# %% [markdown]
# Its samplers (1000-step DDPM, DPM-Solver++ at few evaluations) against z ~ N(0, I) and the plain
# LM: time per z, distance to held-out posteriors, and the text generated from those z scored by
# the plain LM (ltm/bench/prior.py states the estimators).

# %%
prior_table, prior_bench = prior_benchmark(
    params_path, paths["checkpoint_dir"], metrics_path=prior_paths["prior_bench_path"],
    plot_path=prior_paths["prior_plot_path"])
display(pd.Series({k: v for k, v in prior_bench.items() if not isinstance(v, (dict, list))},
                  name="value").to_frame())
prior_table.round(3)

# %% [markdown]
# Text sampled from the trained checkpoint (params.yaml `samples:`; also
# `python -m ltm.generate --checkpoint data/checkpoints --prompt "ROMEO:"`).

# %%
from ltm.stages.train import samples_stage

samples_stage(params_path, paths["checkpoint_dir"], samples_path)

# %% [markdown]
# ## The stage's headline metrics
# What `dvc metrics diff` and `dvc exp show` compare (reports/metrics/train.json); every number
# above is in the results files (reports/results/).

# %%
from ltm.stages.summary import train_summary, write_summary

summary_paths = stage_paths("train", summary_path=summary_path)
summary = write_summary(summary_paths["summary_path"],
                        train_summary(result.metrics, prior_metrics, prior_bench))
pd.json_normalize(summary, sep=".").T.rename(columns={0: "value"})
