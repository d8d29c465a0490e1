"""The check cells of the exercises: compare a reader's figure with the page's, and say so in words
("correct: ..." / "not yet: ..."), never failing the notebook when nothing has been tried yet."""

from __future__ import annotations


def check_number(label: str, got, want: float, unit: str = "", rel: float = 0.1, fmt: str = "{:,.1f}") -> str:
    """One line: "not yet" while ``got`` is None or more than ``rel`` from ``want``, else "correct"
    with the page's figure."""
    if not want:
        raise ValueError(f"{label}: the page's figure is {want!r}; a relative check needs a non-zero one")
    shown = (fmt.format(want) + (f" {unit}" if unit else "")).strip()
    if got is None:
        return f"{label}: not yet (set it to your figure and run this cell again)"
    if abs(float(got) / want - 1) <= rel:
        return f"{label}: correct: {shown}"
    return f"{label}: not yet: {got} is more than {rel:.0%} away from the page's figure"
