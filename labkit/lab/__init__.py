"""The lab: measurement, diagnosis, plots, widgets, notebook glue and the article's approximate cache.

It imports the product (``labkit``'s models, caches, decoders and ops); the product never imports it.
"""
