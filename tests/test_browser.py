"""The workbook in a real browser: JupyterLab serves notebook 00, headless Chromium runs it on the CPU,
and the roofline widget redraws when its batch slider moves; and a committed notebook opened, saved
without running and closed is left byte-identical (its fast twin, without a browser, checks every
notebook's metadata).

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
    root = tmp_path / "lab"
    root.mkdir()
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    # one more cell, in the copy only: which labkit the browser's kernel imports
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "labkit-origin", "metadata": {},
                        "outputs": [], "source": CHECK_CELL})
    (root / NOTEBOOK.name).write_text(json.dumps(nb), encoding="utf-8")
    yield from _serve(tmp_path, root)


@pytest.fixture
def lab_over_committed(tmp_path):
    """A JupyterLab server over byte-for-byte copies of the committed notebooks (and the glossary)."""
    root = tmp_path / "lab"
    root.mkdir()
    for path in [*NOTEBOOK.parent.glob("*.ipynb"), *NOTEBOOK.parent.glob("*.md")]:
        shutil.copyfile(path, root / path.name)
    yield from _serve(tmp_path, root)


def _serve(tmp_path, root):
    home = tmp_path / "jupyter"
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


def _open_in_lab(pw, chromium: str, base: str, token: str, name: str):
    """(browser, page) with notebook ``name`` open in JupyterLab at ``base``; close the browser after."""
    # root in CI: no sandbox; containers often have a small /dev/shm
    browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                 args=["--no-sandbox", "--disable-dev-shm-usage"])
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/lab/tree/{name}?token={token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    except BaseException:
        browser.close()
        raise
    return browser, page


def _roofline_image(page) -> str:
    return page.locator(".jupyter-widgets .widget-output img").first.get_attribute("src") or ""


def test_roofline_widget_redraws_in_jupyterlab(chromium, lab, tmp_path):
    from playwright.sync_api import sync_playwright

    base, token = lab
    with sync_playwright() as pw:
        browser, page = _open_in_lab(pw, chromium, base, token, NOTEBOOK.name)
        try:
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


# the committed notebooks a reader opens first (00) and last (08); every notebook has the same metadata
CLEAN_OPEN = [NOTEBOOK, REPO / "notebooks" / "08_summary.ipynb"]


@pytest.mark.parametrize("committed", CLEAN_OPEN, ids=lambda p: p.stem)
def test_opening_a_committed_notebook_and_closing_it_leaves_it_byte_identical(chromium, lab_over_committed, tmp_path,
                                                                             committed):
    """Opened in JupyterLab with the kernel `make lab` installs, a committed notebook is not marked
    modified once its kernel has started (kernelspec and language_info are as JupyterLab writes them:
    `python -m labkit strip-notebooks`), and saving it without running anything, as autosave would,
    then closing it, writes back the same bytes."""
    from playwright.sync_api import sync_playwright

    base, token = lab_over_committed
    served = tmp_path / "lab" / committed.name
    before = served.read_bytes()
    assert before == committed.read_bytes()
    with sync_playwright() as pw:
        browser, page = _open_in_lab(pw, chromium, base, token, committed.name)
        try:
            # the kernel has answered kernel_info (which sets language_info) and JupyterLab has read its spec
            page.wait_for_function(
                "() => { const w = window.jupyterapp?.shell.currentWidget;"
                " return w?.sessionContext?.session?.kernel?.status === 'idle'"
                " && w.context.model.getMetadata('language_info')?.version"
                " && w.context.model.getMetadata('kernelspec')?.language; }", timeout=90_000)
            page.wait_for_timeout(3_000)  # any metadata update still on its way
            dirty = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.dirty")
            metadata = page.evaluate("() => JSON.stringify(window.jupyterapp.shell.currentWidget.context.model"
                                     ".toJSON().metadata)")
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
            page.evaluate("() => window.jupyterapp.commands.execute('application:close')")
            page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel')", timeout=30_000)
        finally:
            browser.close()
    after = served.read_bytes()
    committed_meta = json.loads(before)["metadata"]
    shown = {k: committed_meta.get(k) for k in ("kernelspec", "language_info")}
    assert not dirty, (f"JupyterLab marked {committed.name} modified on opening; it wants {metadata}, "
                       f"the file has {json.dumps(shown)}: run python -m labkit strip-notebooks")
    assert after == before, f"saving {committed.name} unchanged rewrote it: run python -m labkit strip-notebooks"


def test_committed_notebooks_carry_what_jupyterlab_writes():
    """The fast twin of the test above, without a browser: every committed notebook already has the
    kernelspec and language_info that JupyterLab writes with this environment's kernel (the one
    `make lab` installs; language_info's version is this interpreter's Python), in the layout its
    server saves, so opening one marks nothing modified. A notebook run elsewhere (papermill on the
    GPU machine) is brought back to it with `python -m labkit strip-notebooks notebooks/*.ipynb`."""
    from labkit.lab.notebooks import lab_layout, lab_metadata, notebook_paths

    want = lab_metadata()
    stale = []
    for path in notebook_paths():
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        wrong = [k for k, v in want.items() if nb["metadata"].get(k) != v]
        if wrong or lab_layout(nb) != text:
            stale.append(f"{path.name} ({', '.join(wrong) or 'layout'})")
    assert not stale, f"run python -m labkit strip-notebooks on: {', '.join(stale)}"
