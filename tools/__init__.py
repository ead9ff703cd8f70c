"""Offline tools (openinfer-verify-log, openinfer-keys) and the training scripts, run as
``python tools/train_*.py``; runtime code (engine_core, frontend) never imports this package."""
