"""JupyterLab's view of the stage notebooks: the contents manager that `make` configures (in
jupyter_config/jupyter_server_config.json) so that `notebooks/*.py` open as notebooks on the
kernel "Python (ltm)" and are not marked modified the moment the kernel starts.

Jupytext's contents manager reads a percent-format `.py` as a notebook; where no paired `.ipynb`
exists yet it names the kernel of the Python running the server (ours: `ltm`). JupyterLab then
writes the kernel's `language_info` into the notebook's metadata when the kernel starts; a text
notebook stores none (notebooks/jupytext.toml keeps all metadata out of the `.py`), so that write
is a change and the notebook shows as modified before anyone touched it. This manager adds the
`language_info` the kernel will report, so the write changes nothing. The `.py` stays as it was:
the metadata filter drops `language_info` again on save.
"""
from __future__ import annotations

import copy
import os
import shutil
import sys
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

from ltm.notebook import KERNEL_NAME


def _runs_this_python(argv0: str) -> bool:
    """Whether a kernelspec's interpreter is the one running this process: only then does the
    kernel report the Python version that this process would write into `language_info`."""
    found = argv0 if os.path.isabs(argv0) else shutil.which(argv0)
    return bool(found) and os.path.isfile(found) and os.path.samefile(found, sys.executable)


def kernel_metadata(kernel_name: str = KERNEL_NAME) -> dict[str, Any]:
    """The notebook metadata JupyterLab writes once kernel `kernel_name` runs (`kernelspec` and
    `language_info`), or {} when that kernel is not installed or runs another Python."""
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        return {}
    if spec.language != "python" or not spec.argv or not _runs_this_python(spec.argv[0]):
        return {}
    return {"kernelspec": {"name": kernel_name, "display_name": spec.display_name,
                           "language": spec.language},
            # ipykernel's own answer to kernel_info, so the two cannot drift apart
            "language_info": copy.deepcopy(IPythonKernel.language_info)}


def complete_metadata(metadata: dict[str, Any], kernel: dict[str, Any]) -> bool:
    """Give a notebook without kernel metadata that of `kernel` (see kernel_metadata), or add
    the missing `language_info` to one already on that kernel. Returns whether it changed."""
    if not kernel:
        return False
    spec = metadata.get("kernelspec")
    if spec is None:
        metadata["kernelspec"] = copy.deepcopy(kernel["kernelspec"])
    elif spec.get("name") != kernel["kernelspec"]["name"]:
        return False  # another kernel chosen on purpose: its language_info is its own
    if "language_info" in metadata:
        return spec is None
    metadata["language_info"] = copy.deepcopy(kernel["language_info"])
    return True


JupytextContentsManager = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)


class NotebookContentsManager(JupytextContentsManager):
    """Jupytext's contents manager (text notebooks) that completes the kernel metadata of every
    notebook it reads; see the module's docstring."""

    async def get(self, path: str, content: bool = True, type: str | None = None,
                  format: str | None = None, **kwargs: Any) -> dict[str, Any]:
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if content and model.get("type") == "notebook" and model.get("content") is not None:
            # looked up on every read: `make` may install the kernel while the server runs
            complete_metadata(model["content"]["metadata"], kernel_metadata())
        return model
