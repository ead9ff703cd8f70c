"""The frontend process: ``openinfer-frontend``'s entry point and the flags it shares with ``openinfer-serve``."""
