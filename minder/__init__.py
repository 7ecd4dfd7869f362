"""Minder: keeps very large GPU training jobs healthy."""

__version__ = "0.1.0"
