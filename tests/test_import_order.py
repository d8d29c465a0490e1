"""A notebook imports labkit, then picks Triton's interpreter on a machine without a GPU
(labkit.lab.notebooks.cpu_environment sets TRITON_INTERPRET before triton is imported). If importing
labkit already imported triton, every jit function would be built for the compiler and the
interpreted kernels that call them would fail: so importing labkit must not import triton."""

import os
import subprocess
import sys


def test_importing_labkit_does_not_import_triton():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys, labkit, labkit.lab.notebooks, labkit.model, labkit.cache, labkit.prefix_cache\n"
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing labkit imported triton (see this test's docstring)"
