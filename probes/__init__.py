"""Probes that run on compute nodes: ``python -m probes <name> [options]``.

This package imports nothing from ``healthd``; ``probes.result`` is the one module both share.
"""
