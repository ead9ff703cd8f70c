"""openinfer.benchmarks: ``openinfer-bench`` (load, latency and the seed's acceptance table) and its sweep.

A client of any vLLM-compatible server: it imports no torch (``engine_step.py``, a model-step timer, does).
"""
