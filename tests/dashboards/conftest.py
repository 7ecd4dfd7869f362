"""Lets the tests import the repository's ``dashboards`` package (the checkout's, with its
builders) also when pytest is started as ``pytest`` rather than ``python -m pytest``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)
