"""Every launch that passes ``**interpreter_flags(...)`` launches a kernel that takes those flags.

Triton's CPU interpreter accepts keyword arguments a kernel does not declare, and the compiler on a
GPU refuses them ("Keyword argument DOT_F32 was specified but unrecognised"), so the CPU tests alone
cannot catch a kernel that forgot one: this reads the launches from the source instead."""

import ast
import importlib
import inspect
import pkgutil

import pytest

import labkit.ops
from labkit.ops.launch import interpreter_flags

FLAGS = set(interpreter_flags(__import__("torch").float32))
MODULES = [m.name for m in pkgutil.iter_modules(labkit.ops.__path__)]


def _flagged_launches(tree: ast.AST) -> list[tuple[str, int]]:
    """(kernel name, line) of each ``name[grid](..., **interpreter_flags(...))`` call."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name)):
            continue
        unpacked = [k.value for k in node.keywords if k.arg is None]
        if any(isinstance(v, ast.Call) and getattr(v.func, "id", None) == "interpreter_flags" for v in unpacked):
            found.append((node.func.value.id, node.lineno))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_flagged_launches_name_kernels_that_take_the_flags(name):
    module = importlib.import_module(f"labkit.ops.{name}")
    source = inspect.getsource(module)
    for kernel, line in _flagged_launches(ast.parse(source)):
        fn = getattr(getattr(module, kernel), "fn", None)
        assert fn is not None, f"labkit.ops.{name}:{line}: {kernel} is not a Triton kernel"
        missing = FLAGS - set(inspect.signature(fn).parameters)
        assert not missing, f"labkit.ops.{name}:{line}: {kernel} is launched with {sorted(missing)} it does not take"


def test_the_check_finds_launches():
    tree = ast.parse("k[(1,)](x, BLOCK=4, **interpreter_flags(x.dtype))\nf(x, **other(x))\n")
    assert _flagged_launches(tree) == [("k", 1)]
    module = importlib.import_module("labkit.ops.prefill_fusions")
    assert ("_attention_inputs_kernel" in {k for k, _ in _flagged_launches(ast.parse(inspect.getsource(module)))})
