"""Remove papermill's injected-parameters cell from executed notebooks before they are committed.

    python tools/strip_injected_parameters.py notebooks/*.ipynb

`python -m labkit notebooks` (make run) already writes its outputs without that cell; this is for
notebooks executed by papermill directly. Only the cells list changes (see
labkit.notebooks.drop_injected_parameters).
"""

import sys

from labkit.notebooks import drop_injected_parameters

if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}: {'removed the injected-parameters cell' if drop_injected_parameters(path) else 'none'}")
