"""The decode ladder: each rung a way of running one model's prefill and decode steps.

One module per rung (:mod:`.reference`, :mod:`.reference_graph`, :mod:`.fused` with its prefill
:mod:`.fused_prefill`), the contract they keep (:mod:`.protocol`), the step plan of the rungs that
run the fused ops (:mod:`.plan`), the one graph-capture helper (:mod:`.graphs`) and the names of
every rung (:mod:`.registry`, which imports a rung's module only when one of its decoders is made).
"""

from .protocol import Decoder
from .registry import BACKENDS, make_decoder, register

__all__ = ["BACKENDS", "Decoder", "make_decoder", "register"]
