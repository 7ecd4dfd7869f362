"""Faulty-machine detection: rules, peer scoring, continuity. Imports only ``minder.core``."""
