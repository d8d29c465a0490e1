"""What the installed CUDA toolkit's headers say: which API names exist at all (to test an article's
calls against the real ones) and the alignment rules ``cuda.h`` states for ``cuTensorMapEncodeTiled``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

RULE_PATTERNS = (r"tensorMap address must be aligned to \d+ bytes\.",
                 r"globalAddress, which [^.]*? must be \d+ byte aligned\.",
                 r"globalStrides array, which [^.]*? must be a multiple of \d+[^.]*\.")


def toolkit_include(nvcc: str) -> Path | None:
    """The toolkit's include directory as ``nvcc --dryrun`` reports it (nvcc may be a wrapper script)."""
    dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True)
    top = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.M)
    inc = (Path(top.group(1).strip()) / "include").resolve() if top else None
    return inc if inc is not None and inc.is_dir() else None


def search_headers(include: Path, names) -> dict:
    """{"files": how many header files, "hits": name -> files containing it (case-insensitive)}."""
    hits = {n: [] for n in names}
    files = [p for p in include.rglob("*") if p.is_file() and p.suffix in (".h", ".hpp", ".cuh", "")]
    for p in files:
        text = p.read_text(errors="ignore").lower()
        for n in names:
            if n.lower() in text:
                hits[n].append(p.name)
    return {"files": len(files), "hits": hits}


def tensor_map_rules(cuda_h: str) -> tuple[str, list[str]]:
    """(the declaration of cuTensorMapEncodeTiled, the alignment rules its doc comment states); an
    error where cuda.h no longer states them where expected."""
    decl = cuda_h.index("CUresult CUDAAPI cuTensorMapEncodeTiled(")
    block = cuda_h[cuda_h.rindex("/**", 0, decl): decl]
    text = " ".join(" ".join(line.strip().lstrip("*").split()) for line in block.splitlines()).replace("\\p ", "")
    rules = [m.group(0) for pat in RULE_PATTERNS if (m := re.search(pat, text))]
    if not rules:
        raise ValueError("cuda.h no longer states the tensor map's alignment rules where expected")
    return cuda_h[decl: cuda_h.index(";", decl) + 1], rules
