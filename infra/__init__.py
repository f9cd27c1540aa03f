"""Deployment declarations and operator files (not installed with the package; run from the repo root)."""
