"""Builders of test checkpoints in real Hugging Face layouts (test fixtures, never used at serving time)."""
