"""Speculative-decoding metrics: the diffing bridge, the acceptance tally and its readers (the log line,
per-request metrics), and which spec-log lines were counted."""
