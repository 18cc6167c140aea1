"""Verification stage: explaining what the hot phase had to redo."""
