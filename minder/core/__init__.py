"""Contracts shared by every package: metric names, records, codecs, errors.

Nothing here imports any other package of ours (see docs/architecture.md §2).
"""
