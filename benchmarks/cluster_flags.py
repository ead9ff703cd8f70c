"""The flags the benchmarks give the launcher's frontends and ``--fake-model`` engines
(``openinfer.engine_core.launch.local_cluster``): warnings only in the logs, room for many requests."""

QUIET = ("--log-level", "warning")
# 8192 KV blocks and 256 sequences: load, not the engine's bounds, is what a benchmark's fake engine meets
LOAD_ENGINE = ("--num-kv-blocks", "8192", "--max-num-seqs", "256", *QUIET)
