# %% [markdown]
# # Report
# Collects the metrics and plot data of every stage into `reports/report.html`: one page with the
# tables and figures below, and the commit, versions and device they came from.

# %% tags=["parameters"]
params_path = "params.yaml"
output = "reports/report.html"

# %%
# %matplotlib inline
from ltm.notebook import enter_project_root

# JupyterLab starts the kernel in notebooks/; the paths in params.yaml are from the root
enter_project_root();

# %%
from IPython.display import display

from ltm.report import report_stage

sections = report_stage(params_path, output=output)
for section in sections:
    print(f"== {section.title} ==", section.note)
    for figure in section.figures:
        display(figure)
    for table in section.tables:
        display(table)
