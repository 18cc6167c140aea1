"""Verification: the matrix, the runner and the verdicts (docs/verify.md)."""
