# %% [markdown]
# # Report
# Collects the metrics and plot data of every stage into `reports/report.html`: one page with the
# tables and figures below, and the commit, versions and device they came from.

# %% tags=["parameters"]
params_path = "params.yaml"
output = "reports/report.html"

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
