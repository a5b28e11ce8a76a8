"""Judgement: pure functions from stored results to per-node verdicts."""
