# %% [markdown]
# # Study: do latent thoughts carry information?
# Small decoders that see only a narrow window (params.yaml `study:`, ltm/study/), so that z is
# the only channel beyond it, trained on the same batches: the latent model (encoder + a few
# inference steps), a plain model with as many parameters (equal tokens, and equal training
# FLOPs), one learned z shared by all sequences, z of another sequence, and dynamic evaluation of
# the plain model. Each scores the second half of every validation sequence given the first,
# paired per sequence: gain = control - latent, nats per token, +- its standard error. Two sources:
# the synthetic testbed (data.synthetic, whose answer is known) and the token cache. A stage of its
# own: an experiment on the trained model never reruns it.

# %% tags=["parameters"]
# dvc.yaml passes the paths; opened in JupyterLab, None means "the value in dvc.yaml"
params_path = "params.yaml"
metrics_path = None
summary_path = None

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from IPython.display import Markdown, display

from ltm.pipeline import stage_paths
from ltm.report.study import (bound_figure, encoder_table, inner_lr_table, published_table, study_table,
                              verdict_lines)
from ltm.stages.study import study_stage

paths = stage_paths("study", metrics_path=metrics_path, summary_path=summary_path)
# no progress bars (a stored notebook keeps every update): the study's own log is shown below,
# and the terminal gets one line per source, its answer against the parameter-matched plain model
study_log = []
study = study_stage(params_path, paths["metrics_path"], paths["summary_path"], progress=False,
                    say=study_log.append)
print("\n".join(line for line in verdict_lines(study) if "as many parameters" in line))
display(Markdown("\n".join(f"- {line}" for line in verdict_lines(study))))
display(Markdown("Log: " + "; ".join(study_log)))
study_table(study)

# %% [markdown]
# The latent model's inner step size (study.inner_lrs): a pilot per candidate on the first training
# seed, the lowest training loss chosen; the other seeds train at it. The scored suffix NLL is shown,
# not used.

# %%
inner_lr_table(study)

# %% [markdown]
# The bound (NLL + KL per token) by inference steps, for the encoder's start and the cold starts,
# and what the encoder buys: the cold-start steps that reach its bound.

# %%
bound_figure(study)

# %%
encoder_table(study)

# %% [markdown]
# The latent model's bound as the LTM authors report it (q and its noise fitted to the scored
# text: biased low), the honest bound (fresh noise), IWAE with 64 samples, and the suffix NLL given
# the prefix that the study compares: how much of a published figure is optimism.

# %%
published_table(study)
