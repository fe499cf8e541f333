"""Leaf helpers every layer may use (nothing here imports the rest of repro)."""
