"""What an alert shows: the machine's window of the deviating series against its peers."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from detectors.config import DetectorConfig
from detectors.window import JobWindow


def similarity_evidence(
    window: JobWindow,
    now: int,
    col: int,
    machine: int,
    peers: np.ndarray,
    config: DetectorConfig,
) -> dict[str, Any]:
    """The machine's recent values of series ``col`` against its peers' median and 10–90 % band.

    Covers the continuity period (at most a minute) so an operator sees the deviation start;
    ``missing_samples`` counts the machine's absent seconds in the scored window, which was
    scored on what was present.
    """
    length = max(config.window_s, min(config.continuity_s, 60))
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
        "window_start_ts": now - length + 1,
        "machine_window": floats(own),
        "peer_median_window": floats(peer_median),
        "peer_band_window": [floats(low), floats(high)],
        "missing_samples": int(np.isnan(own[-config.window_s :]).sum()),
    }


def floats(values: np.ndarray) -> list[float | None]:
    """JSON-ready values: NaN becomes None, six decimals."""
    return [None if not math.isfinite(v) else round(float(v), 6) for v in values]
