"""The lab: measurement, diagnosis, plots, widgets, notebook glue and the article's approximate cache.

It imports the product (``labkit``'s models, caches, decoders and ops); the product never imports it
(tests/test_layering.py). The lab side also counts ``labkit.bench`` (benchmarks, the tuning sweep),
``labkit.train`` (the runs that made the shipped checkpoints), ``labkit.distributed`` (multi-GPU jobs)
and the command line ``labkit/__main__.py``.

The article's cache, ``labkit.lab.article_cache.ArticleCache``, is the source article's two-level
cache as an APPROXIMATE decode option (a reused step returns an earlier step's output): a lab
experiment measured against the exact caches of the product (``labkit.HybridCache``,
``labkit.PrefixCache``), not one of them.
"""
