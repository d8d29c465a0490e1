"""notebooks/GLOSSARY.md: every fixed anchor has its heading, and every link to the glossary from a
notebook (or from the glossary to a notebook) resolves."""

import json
import re

from labkit import resources

NOTEBOOKS = resources.notebooks_dir()
GLOSSARY = NOTEBOOKS / "GLOSSARY.md"
# The anchors other pages link to (fixed: a notebook links a term as GLOSSARY.md#<anchor>).
ANCHORS = """roofline ridge-point memory-bound arithmetic-intensity hbm l2-cache sm occupancy warp gemv gemm split-k
tensor-core tf32 fixed-cost-per-kernel cuda-graph pdl fusion persistent-kernel tma mbarrier cpasync bank-conflict
littles-law warp-specialisation prefill decode ttft kv-cache prefix-cache gqa short-convolution delta-rule
gated-deltanet chunked-delta-rule rmsnorm rope tensor-parallelism all-reduce nvlink nsight-compute
triton-interpreter""".split()
LINK = re.compile(r"GLOSSARY\.md#([^)\s\"'>]+)")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings() -> list[str]:
    return [github_slug(line[4:]) for line in GLOSSARY.read_text(encoding="utf-8").splitlines()
            if line.startswith("### ")]


def test_github_slug_matches_githubs_rules():
    assert github_slug("Little's law") == "littles-law"
    assert github_slug("cp.async") == "cpasync"
    assert github_slug("split-K") == "split-k"
    assert github_slug("Nsight Compute (ncu)") == "nsight-compute-ncu"


def test_every_fixed_anchor_has_exactly_one_heading():
    found = headings()
    assert sorted(found) == sorted(set(found)), "a heading appears twice"
    assert [a for a in ANCHORS if a not in found] == []
    assert [h for h in found if h not in ANCHORS] == [], "a heading no page can link to by a fixed anchor"


def test_every_glossary_link_in_the_notebooks_resolves():
    anchors, broken = set(headings()), []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            broken += [f"{path.name} cell {i}: #{a}" for a in LINK.findall("".join(cell["source"])) if a not in anchors]
    assert broken == []


def test_every_notebook_the_glossary_names_exists():
    named = set(re.findall(r"\]\(([^)#]+\.ipynb)\)", GLOSSARY.read_text(encoding="utf-8")))
    assert named and [n for n in named if not (NOTEBOOKS / n).is_file()] == []
