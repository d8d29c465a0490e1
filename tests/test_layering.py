"""The product never imports the lab.

The product is what a user of the package runs: ``labkit/`` itself (config, model, cache,
prefix_cache, generate, sampling, tokenizer, weights, checkpoint, shipped, resources) and its
packages ``decode/``, ``ops/``, ``tuning/``, ``cuda/``. The lab is the workbook's tooling around it,
which imports the product and never the reverse:

    labkit/lab/          measurement, diagnosis, plots, widgets, notebook glue, the article's cache
    labkit/bench/        benchmarks and the tuning sweep (they time the product, write data/bench)
    labkit/train/        the training runs that made the shipped checkpoints
    labkit/distributed/  torchrun jobs that serve and measure the product on several GPUs
    labkit/__main__.py   the command line, whose commands are the lab's

Every import statement of every product module is read with ``ast`` (module level and inside
functions, absolute and relative), so that a lazy import inside a function counts as much as one at
the top of a file; and ``import labkit`` must leave no lab module in ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labkit"
LAB = ("labkit.lab", "labkit.bench", "labkit.train", "labkit.distributed", "labkit.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_lab(name: str) -> bool:
    return any(name == lab or name.startswith(lab + ".") for lab in LAB)


def product_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if not is_lab(module_name(p)))


def imported_modules(path: Path) -> list[tuple[int, list[str]]]:
    """(line, the absolute names it may import) of every import statement in a file. ``from X import
    y`` may import X and X.y (y may be a submodule: ``from . import lab``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.append((node.lineno, [source] + [f"{source}.{a.name}" for a in node.names if a.name != "*"]))
    return found


def lab_imports(paths: list[Path]) -> list[str]:
    """'file:line imports module' for each import statement of these files that reaches the lab."""
    out = []
    for p in paths:
        for line, names in imported_modules(p):
            lab = [n for n in names if is_lab(n)]
            if lab:
                out.append(f"{p.relative_to(PACKAGE.parent)}:{line} imports {lab[0]}")
    return out


def test_the_split_is_what_the_docstring_says():
    names = {module_name(p) for p in product_modules()}
    assert {"labkit", "labkit.model", "labkit.generate", "labkit.resources", "labkit.decode.registry",
            "labkit.ops.linear", "labkit.tuning", "labkit.cuda"} <= names
    assert not any(is_lab(n) for n in names)
    assert is_lab("labkit.lab.article_cache") and is_lab("labkit.bench") and not is_lab("labkit.laboratory")


def test_no_product_module_imports_the_lab():
    found = lab_imports(product_modules())
    assert not found, "the product imports the lab (the lab may import the product, never the reverse):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("where, source, expected", [
    ("planted.py", "from .lab.article_cache import ArticleCache", "labkit.lab.article_cache"),
    ("planted.py", "from . import lab", "labkit.lab"),
    ("planted.py", "from . import config, __main__", "labkit.__main__"),
    ("decode/__init__.py", "from ..bench import results", "labkit.bench"),
    ("decode/planted.py", "def f():\n    from ..bench import results", "labkit.bench"),
    ("ops/planted.py", "class C:\n    def m(self):\n        import labkit.distributed.cli", "labkit.distributed.cli"),
    ("ops/planted.py", "from labkit import train", "labkit.train"),
])
def test_a_planted_lab_import_is_found(tmp_path, monkeypatch, where, source, expected):
    """The check itself can fail: a lab import planted in a product module is named, once, with its line."""
    fake = tmp_path / "labkit"
    planted = fake / where
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("import torch\nfrom . import config\n" + source + "\n")
    (fake / "lab").mkdir()
    (fake / "lab" / "x.py").write_text("from .. import model\n")  # the lab importing the product is fine
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert lab_imports(product_modules()) == [f"labkit/{where}:{2 + source.count(chr(10)) + 1} imports {expected}"]


def test_importing_labkit_imports_no_lab_module():
    code = ("import sys, labkit\n"
            f"print([m for m in sys.modules if any(m == l or m.startswith(l + '.') for l in {LAB!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import labkit imported lab modules: {out.stdout.strip()}"


def test_the_top_level_api_is_the_product():
    import labkit

    lab = [n for n in labkit.__all__ if is_lab(getattr(getattr(labkit, n), "__module__", "") or "")]
    assert not lab, f"labkit.__all__ exports lab names: {lab}"
    assert "ArticleCache" not in labkit.__all__ and not hasattr(labkit, "ArticleCache")
