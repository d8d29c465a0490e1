"""The decode ladder: each rung a way of running one model's prefill and decode steps."""
