"""Passive signals: what the site's Prometheus (dcgm-exporter's series) says about nodes' GPUs."""
