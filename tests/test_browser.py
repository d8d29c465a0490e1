"""The workbook in a real browser: JupyterLab serves notebook 00, headless Chromium runs it on the CPU,
and the roofline widget redraws when its batch slider moves.

JupyterLab listens on 127.0.0.1 only, on a free port, behind a random token, over a copy of the
notebook (the committed file is never touched), with its settings, workspaces and kernels' IPython
profile in the test's folder. Its kernels import labkit from this checkout (PYTHONPATH) and see no GPU.
Chromium is the system's (Debian's `chromium`, which `make test` installs on CI), driven through
Playwright's Python client; Playwright's own browser downloads are never used. Without chromium or
playwright the test skips, except where the CI variable is set: there it fails, so CI never skips it.
"""

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "00_model_and_roofline.ipynb"
CHECK_CELL = "import labkit\nprint('labkit imported from', labkit.__file__)"


@pytest.fixture
def chromium() -> str:
    """The system's Chromium, once JupyterLab and Playwright are known to be there too."""
    missing = [what for what, there in [
        ("chromium (apt-get install chromium)", shutil.which("chromium")),
        ("playwright (the test extra)", importlib.util.find_spec("playwright")),
        ("jupyterlab (the notebooks extra)", importlib.util.find_spec("jupyterlab")),
    ] if not there]
    if missing:
        reason = f"the browser test needs {', '.join(missing)}; make test installs them (chromium as root)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but {reason}")
        pytest.skip(reason)
    return shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server over a copy of notebook 00; yields (base url, token). Shut down afterwards,
    kernels first, whatever the test did."""
    root, home = tmp_path / "lab", tmp_path / "jupyter"
    root.mkdir()
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    # one more cell, in the copy only: which labkit the browser's kernel imports
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "labkit-origin", "metadata": {},
                        "outputs": [], "source": CHECK_CELL})
    (root / NOTEBOOK.name).write_text(json.dumps(nb), encoding="utf-8")
    config = home / "config"
    (config / "labconfig").mkdir(parents=True)
    # no news, update checks or extension listings (no network, no pop-up over the notebook);
    # window.jupyterapp lets the test run JupyterLab's own commands
    (config / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {
        "news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
        "expose_app_in_browser": True, "extension_manager": "readonly"}}))
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "CUDA_VISIBLE_DEVICES": "",  # the CPU path, on any machine
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(home / "data"),  # no user kernelspecs: this interpreter's kernel
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = (tmp_path / "jupyterlab.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited ({server.returncode}):\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}")
            try:
                _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer on {base} within 90 s")
                time.sleep(0.5)
        yield base, token
    finally:
        _stop(server, base, token)
        log.close()


def _stop(server: subprocess.Popen, base: str, token: str) -> None:
    """Kernels through the API, then the server; what is left of its process group is killed."""
    try:
        for kernel in json.loads(_get(f"{base}/api/kernels?token={token}")):
            request = urllib.request.Request(f"{base}/api/kernels/{kernel['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(request, timeout=15).close()
    except OSError:
        pass  # the server is already gone
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    try:
        os.killpg(server.pid, signal.SIGKILL)  # a kernel that outlived its server (same session)
    except ProcessLookupError:
        pass


def _roofline_image(page) -> str:
    return page.locator(".jupyter-widgets .widget-output img").first.get_attribute("src") or ""


def test_roofline_widget_redraws_in_jupyterlab(chromium, lab, tmp_path):
    from playwright.sync_api import sync_playwright

    base, token = lab
    with sync_playwright() as pw:
        # root in CI: no sandbox; containers often have a small /dev/shm
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel",
                                   timeout=90_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # the last cell (ours) prints where labkit came from once everything above it has run
            origin = page.locator(".jp-Cell").last.locator(".jp-OutputArea-output")
            origin.wait_for(timeout=300_000)
            assert origin.inner_text().strip() == f"labkit imported from {REPO / 'labkit' / '__init__.py'}"
            errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
            assert errors.count() == 0, "\n---\n".join(errors.all_inner_texts())

            batch = page.locator(".widget-hslider", has=page.locator("label", has_text="batch"))
            batch.wait_for(timeout=30_000)
            page.wait_for_function("() => document.querySelector('.jupyter-widgets .widget-output img')")
            before, readout = _roofline_image(page), batch.locator(".widget-readout").inner_text()
            batch.locator(".noUi-handle").first.focus()
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "(before) => { const img = document.querySelector('.jupyter-widgets .widget-output img');"
                " return img && img.src !== before; }", arg=before, timeout=60_000)
            assert batch.locator(".widget-readout").inner_text() != readout
            assert _roofline_image(page) not in ("", before)
            page.screenshot(path=str(tmp_path / "roofline-widget.png"), full_page=True)
        finally:
            browser.close()
