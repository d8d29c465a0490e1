# The two commands of the README. Both set up .venv from nothing on a fresh machine.
#   make test   install, then run the whole test suite (CPU is enough: kernels run in Triton's interpreter)
#   make run    install, then execute every notebook with papermill into build/ and print a summary
# and one to read and play:
#   make lab    install, then open the workbook in JupyterLab (LAB_ARGS="--no-browser --port 8899" ...)
# and on a GPU machine:
#   make gpu-test   the GPU suite at the real shapes (tests/gpu; ~3 minutes on an H200 with pytest-xdist)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# On a machine without an NVIDIA GPU, Triton comes from here (for its interpreter); CUDA builds of
# torch bring the Triton they were built with.
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
TRITON   := $(if $(HAVE_GPU),,triton==3.6.0)

.PHONY: test run lab install chromium clean gpu-test

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch $(TRITON)
	$(PIP) install -q -c constraints.txt -e ".[test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(VENV)/.installed

# tests/test_notebooks.py already runs every notebook once through papermill (errors fail it); nbval
# then re-runs only the notebooks with cells whose committed outputs it compares (NBVAL_CHECK_OUTPUT):
# running all of them twice cost CI some twelve minutes for one checked cell.
NBVAL_NOTEBOOKS = $(shell grep -l NBVAL_CHECK_OUTPUT notebooks/*.ipynb 2>/dev/null)

# The suite on worker processes, one per core up to TEST_WORKERS (pytest-xdist; worksteal: the
# notebooks and interpreter kernels take minutes each and would otherwise end the run on one worker);
# the slowest tests are listed at the end, where CI time goes.
TEST_WORKERS ?= 4

test: $(VENV)/.installed chromium
	$(PY) -m pytest -q -n auto --maxprocesses $(TEST_WORKERS) --dist worksteal --durations 15 tests
	$(if $(NBVAL_NOTEBOOKS),$(PY) -m pytest -q -p no:cacheprovider --nbval-lax $(NBVAL_NOTEBOOKS))

# The GPU machine usually has its own CUDA torch: this venv's python when there is one, else python3.
# tests/gpu/conftest.py spreads the suite over worker processes when pytest-xdist is installed.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))

gpu-test:
	@$(GPU_PYTHON) -c "import xdist" 2>/dev/null || echo "pytest-xdist is not installed: the GPU suite runs serially (well over 10 minutes); pip install pytest-xdist"
	$(GPU_PYTHON) -m pytest -m gpu tests/gpu

run: $(VENV)/.installed
	$(PY) -m labkit notebooks --out build

lab: $(VENV)/.installed
	$(PY) -m jupyterlab notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# tests/test_browser.py drives Debian's Chromium (never a browser that Playwright downloads). Installed
# here when missing where apt-get can (root: CI); elsewhere that test skips, and says why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is not installed (apt-get install chromium): the browser test will be skipped"; fi; }

clean:
	rm -rf $(VENV) build
