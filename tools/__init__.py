"""Offline tools (openinfer-verify-log, openinfer-keys) and the training scripts, run as
``python tools/train_*.py``; and ``private_file``, the one way openinfer opens a private file, here because the
frontend and the engine may both import this package (importing it loads nothing else)."""
