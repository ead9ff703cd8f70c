"""openinfer.frontend: the OpenAI-compatible API process (no torch here: its image installs none)."""
