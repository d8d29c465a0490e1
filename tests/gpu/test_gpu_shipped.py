"""The shipped checkpoints decode to the same greedy text with every backend: the test of
tests/test_shipped_checkpoints.py, collected here too so that `python -m pytest -m gpu tests/gpu`
runs it on the GPU (where the graph backends join in) without restating it."""

from test_shipped_checkpoints import test_every_backend_decodes_the_same_greedy_text  # noqa: F401
