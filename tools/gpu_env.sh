# Source this on a GPU machine with no network: installs the wheels carried in .whl/ (papermill,
# ipykernel and friends; fla into its own folder) and puts labkit on the path.
#   python3 -m pip download ... -d .whl <names>   (see the device notes) prepares .whl/ beforehand.
set -e
mkdir -p /tmp/site /tmp/fla
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v -e fla_core -e flash_linear) >/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fla \
    .whl/fla_core*.whl .whl/flash_linear*.whl >/dev/null 2>&1 || true
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# fla is a peer for per-kernel comparisons only: add /tmp/fla to PYTHONPATH for those commands.
set +e
