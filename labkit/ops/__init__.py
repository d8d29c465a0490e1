"""Stateless tensor -> tensor operations, each with a plain-torch reference.

Every module here holds one operation: its plain-PyTorch reference (``*_ref``), and where it pays,
a Triton kernel with a launcher that checks its inputs. Nothing here knows about models or caches;
imports flow ``labkit.* -> labkit.ops``, never back.

References: ``norm``, ``rope``, ``causal_conv``, ``delta_rule``, and ``mixers`` (each token mixer
after its input projection, built from those: the model's maths and the decode kernels'
reference). Triton decode kernels (import triton; see ``launch`` for what they share): ``linear``
(skinny GEMM with RMSNorm prologue and residual / SwiGLU / short-conv / argmax epilogues),
``greedy_head``, ``short_conv``, ``gated_delta_decode``, ``attention_decode``; for prefill,
``chunk_delta_rule`` (the chunked delta rule).
"""
