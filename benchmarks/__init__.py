"""openinfer.benchmarks: ``openinfer-bench`` (load, latency and the seed's acceptance table) and its sweep.

A client of any vLLM-compatible server: it imports no torch (``model_step.py`` and ``engine_step.py``, the
in-process timers, do).
"""
