"""What an alert shows: the machine's window of the deviating series against its peers."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from detectors.config import Cadence
from detectors.window import JobWindow


def similarity_evidence(
    window: JobWindow,
    now: int,
    col: int,
    machine: int,
    peers: np.ndarray,
    cadence: Cadence,
) -> dict[str, Any]:
    """The machine's recent values of series ``col`` against its peers' median and 10–90 % band.

    Covers the continuity period (at most 60 samples) so an operator sees the deviation start;
    ``missing_samples`` counts the machine's absent samples in the scored window, which was
    scored on what was present. One value per tick of ``interval_s`` seconds.
    """
    length = max(cadence.window, min(cadence.continuity, 60))
    series = window.window(now, length, np.asarray([col]))[:, :, 0]
    peer_values = series[:, peers]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN seconds of a new machine
        peer_median = np.nanmedian(peer_values, axis=1)
        low = np.nanpercentile(peer_values, 10, axis=1)
        high = np.nanpercentile(peer_values, 90, axis=1)
    own = series[:, machine]
    return {
        "rule": None,
        "peers": int(peers.size),
        "window_start_ts": (window.tick_of(now) - length + 1) * window.tick_s,
        "interval_s": window.tick_s,
        "machine_window": floats(own),
        "peer_median_window": floats(peer_median),
        "peer_band_window": [floats(low), floats(high)],
        "missing_samples": int(np.isnan(own[-cadence.window :]).sum()),
    }


def floats(values: np.ndarray) -> list[float | None]:
    """JSON-ready values: NaN becomes None, six decimals."""
    return [None if not math.isfinite(v) else round(float(v), 6) for v in values]
