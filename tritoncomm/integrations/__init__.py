"""Integrations with the torch ecosystem and inference engines (built on ``collectives``)."""
