"""Probes that run on compute nodes: ``python -m probes <name> [options]``.

This package imports nothing from ``healthd``; ``probes.result`` (the result document) and
``probes.catalogue`` (the probe names and capabilities) are the modules both share.
"""
