"""Stateless tensor -> tensor operations, each with a plain-torch reference.

Every module here holds one operation: its plain-PyTorch reference (``*_ref``), and where it pays,
a Triton kernel with a launcher that checks its inputs. Nothing here knows about models or caches;
imports flow ``labkit.* -> labkit.ops``, never back.
"""
