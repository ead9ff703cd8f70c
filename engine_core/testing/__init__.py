"""Builders of test checkpoints in real Hugging Face layouts (test fixtures, never used at serving time), and
the fake model runner behind ``--fake-model`` (imported by the engine only when that flag is given)."""
