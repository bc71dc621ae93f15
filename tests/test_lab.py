"""JupyterLab's set-up for the stage notebooks (jupyter_config/, installed by `make`; ltm.lab):
what can be checked without a browser. A double-click needs the docmanager's default viewer, the
single kernel needs the server's kernelspec filter, and "not modified on opening" needs the served
notebook to carry the kernel metadata JupyterLab would otherwise write."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import jupyterlab_jupytext
import pytest
from ipykernel.ipkernel import IPythonKernel
from jupyter_core.paths import jupyter_config_path
from traitlets.utils.importstring import import_item

from ltm.lab import NotebookContentsManager, complete_metadata, kernel_metadata
from ltm.notebook import KERNEL_NAME

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "jupyter_config"
SERVER = json.loads((CONFIG / "jupyter_server_config.json").read_text())
LAB = json.loads((CONFIG / "labconfig" / "default_setting_overrides.json").read_text())
LTM_SPEC = {"name": "ltm", "display_name": "Python (ltm)", "language": "python"}


def test_server_config_names_the_project_contents_manager_and_only_the_ltm_kernel():
    cls = import_item(SERVER["ServerApp"]["contents_manager_class"])
    assert cls is NotebookContentsManager
    assert hasattr(cls, "formats"), "not a jupytext manager: the jupytext extension would wrap it"
    assert SERVER["KernelSpecManager"]["allowed_kernelspecs"] == [KERNEL_NAME]
    assert SERVER["MappingKernelManager"]["default_kernel_name"] == KERNEL_NAME


def test_lab_overrides_open_python_files_as_jupytext_notebooks():
    viewers = LAB["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"python": "Jupytext Notebook"}
    assert LAB["@jupyterlab/notebook-extension:tracker"]["autoStartDefaultKernel"] is True
    # the viewer is the name jupytext's lab extension registers its notebook factory under
    static = Path(jupyterlab_jupytext.__file__).parent / "labextension" / "static"
    assert any('"Jupytext Notebook"' in p.read_text(errors="ignore") for p in static.glob("*.js"))


def test_make_installs_every_file_of_jupyter_config():
    makefile = (ROOT / "Makefile").read_text()
    definition = re.search(r"^JUPYTER_CONFIG :=((?:.*\\\n)*.*)$", makefile, re.M).group(1)
    listed = set(re.findall(r"\$\(JUPYTER_ETC\)/(\S+)", definition))
    present = {p.relative_to(CONFIG).as_posix() for p in CONFIG.rglob("*") if p.is_file()}
    assert present == listed
    assert "$(JUPYTER_CONFIG)" in re.search(r"^setup:.*$", makefile, re.M).group(0)


def test_an_installed_copy_matches_the_project():
    # a stale copy in the virtualenv (jupyter_config/ edited, `make` not rerun) shows up here
    installed = Path(sys.prefix) / "etc" / "jupyter"
    if not (installed / "jupyter_server_config.json").is_file():
        pytest.skip("jupyter_config/ not installed in this environment (run make)")
    assert str(installed) in jupyter_config_path()
    for source in CONFIG.rglob("*.json"):
        assert json.loads((installed / source.relative_to(CONFIG)).read_text()) == \
            json.loads(source.read_text()), source.name


def test_jupytext_configs_keep_metadata_out_of_text_files():
    for path in (ROOT / "jupytext.toml", ROOT / "notebooks" / "jupytext.toml"):
        config = tomllib.loads(path.read_text())
        assert config["notebook_metadata_filter"] == "-all", path
    assert "formats" not in tomllib.loads((ROOT / "jupytext.toml").read_text())


def test_complete_metadata_adds_the_kernel_only_where_it_is_missing():
    kernel = {"kernelspec": dict(LTM_SPEC), "language_info": {"name": "python", "version": "3"}}
    bare: dict = {}
    assert complete_metadata(bare, kernel) and bare == kernel
    on_ltm = {"kernelspec": dict(LTM_SPEC)}
    assert complete_metadata(on_ltm, kernel) and on_ltm["language_info"] == kernel["language_info"]
    other = {"kernelspec": {"name": "julia-1.10", "display_name": "Julia", "language": "julia"}}
    assert not complete_metadata(other, kernel) and "language_info" not in other
    done = {"kernelspec": dict(LTM_SPEC), "language_info": {"name": "python", "version": "2"}}
    assert not complete_metadata(done, kernel) and done["language_info"]["version"] == "2"
    assert not complete_metadata(bare := {}, {}) and bare == {}


def ltm_kernel() -> dict:
    kernel = kernel_metadata()
    if not kernel:
        pytest.skip("the ltm kernel is not installed for this Python (run make)")
    return kernel


def test_the_ltm_kernel_metadata_is_what_jupyterlab_writes():
    kernel = ltm_kernel()
    assert kernel["kernelspec"] == LTM_SPEC
    assert kernel["language_info"] == IPythonKernel.language_info


def get(manager: NotebookContentsManager, path: str, **kwargs) -> dict:
    return asyncio.run(manager.get(path, **kwargs))


def test_a_stage_notebook_is_served_as_a_notebook_with_the_full_kernel_metadata():
    kernel = ltm_kernel()
    manager = NotebookContentsManager(root_dir=str(ROOT))
    model = get(manager, "notebooks/train.py", type="notebook")
    assert model["type"] == "notebook"
    metadata = model["content"]["metadata"]
    assert metadata["kernelspec"] == LTM_SPEC
    assert metadata["language_info"] == kernel["language_info"]
    assert len(model["content"]["cells"]) > 3


def test_saving_a_module_opened_as_a_notebook_leaves_it_unchanged(tmp_path):
    # every .py opens as a notebook on double-click: a save must not add a header or an .ipynb
    shutil.copy(ROOT / "jupytext.toml", tmp_path)
    (tmp_path / "pkg").mkdir()
    module = ROOT / "ltm" / "notebook.py"
    shutil.copy(module, tmp_path / "pkg" / "mod.py")
    manager = NotebookContentsManager(root_dir=str(tmp_path))
    model = get(manager, "pkg/mod.py", type="notebook")
    asyncio.run(manager.save(model, "pkg/mod.py"))
    assert (tmp_path / "pkg" / "mod.py").read_text() == module.read_text()
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["mod.py"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def server():
    """A jupyter server on the project's own config (not an installed copy): its base URL."""
    if shutil.which("jupyter-server", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("jupyter server not installed next to this Python")
    ltm_kernel()
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(CONFIG),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
               "--IdentityProvider.token=", f"--ServerApp.root_dir={ROOT}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # containers; a researcher's server runs as themselves
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        # waits for the server's answer; the limit only stops a hung start on a loaded machine
        for _ in range(1800):
            try:
                fetch_json(base + "/api/status")
                break
            except OSError:
                if process.poll() is not None:
                    pytest.fail("jupyter server exited at start")
                time.sleep(0.1)
        else:
            pytest.fail("jupyter server did not answer within 180 s")
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_server_serves_a_stage_notebook_on_the_only_kernel(server):
    specs = fetch_json(server + "/api/kernelspecs")
    assert specs["default"] == KERNEL_NAME and list(specs["kernelspecs"]) == [KERNEL_NAME]
    model = fetch_json(server + "/api/contents/notebooks/train.py?type=notebook&content=1")
    assert model["type"] == "notebook"
    assert model["content"]["metadata"]["kernelspec"] == LTM_SPEC
    assert model["content"]["metadata"]["language_info"] == IPythonKernel.language_info
