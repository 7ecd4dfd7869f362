"""The dashboards Minder ships: the generated JSON of ``dashboards/json``, read back.

The JSON is package data of the ``minder`` wheel (and of the image), so an installed ``minder``
finds its dashboards without ``--dir``; in a source checkout it is the committed folder. Needs
nothing beyond the standard library (the builders of the other modules need
grafana-foundation-sdk, a development tool).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minder.core.errors import MinderError

logger = logging.getLogger(__name__)

JSON_DIR = Path(__file__).resolve().parent / "json"
"""The shipped dashboards (package data; the committed files in a source checkout)."""


class DashboardError(MinderError):
    """The dashboards cannot be read or pushed; the message is one line for the operator."""


@dataclass(frozen=True)
class BundledDashboard:
    """One dashboard JSON file."""

    path: Path
    data: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.data["uid"])

    @property
    def title(self) -> str:
        return str(self.data["title"])

    @property
    def panels(self) -> int:
        """Panels other than rows, those inside collapsed rows included."""
        count = 0
        for panel in self.data.get("panels") or []:
            count += panel.get("type") != "row"
            count += sum(p.get("type") != "row" for p in panel.get("panels") or [])
        return count

    def summary(self) -> dict[str, Any]:
        """``uid``, ``title``, ``panels`` and ``file``, as ``minder dashboards list`` shows."""
        return {"uid": self.uid, "title": self.title, "panels": self.panels, "file": str(self.path)}


def dashboards_dir(explicit: Path | None = None) -> Path:
    """``explicit`` (``--dir``), else the dashboards shipped with Minder (:data:`JSON_DIR`)."""
    if explicit is not None:
        if not explicit.is_dir():
            raise DashboardError(f"--dir {explicit}: no such folder; expected a folder of *.json")
        return explicit
    if not JSON_DIR.is_dir() or not any(JSON_DIR.glob("*.json")):
        raise DashboardError(
            f"no dashboards in {JSON_DIR}: this install lacks its package data; reinstall minder "
            "or pass --dir DIR (generate them with `python -m dashboards.build`)"
        )
    return JSON_DIR


def load_dashboards(directory: Path) -> list[BundledDashboard]:
    """Every ``*.json`` dashboard of ``directory``; a file that is not one raises naming it."""
    result = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DashboardError(f"{path}: not readable JSON ({exc})") from None
        if not isinstance(data, dict) or not data.get("uid") or not data.get("title"):
            raise DashboardError(f"{path}: not a Grafana dashboard (needs a uid and a title)")
        result.append(BundledDashboard(path, data))
    if not result:
        raise DashboardError(f"{directory}: no *.json dashboards")
    uids = [d.uid for d in result]
    duplicates = sorted({uid for uid in uids if uids.count(uid) > 1})
    if duplicates:
        raise DashboardError(
            f"{directory}: several dashboards have the uid {', '.join(duplicates)}"
        )
    logger.debug("%d dashboards in %s", len(result), directory)
    return result


def bundled_dashboards(explicit: Path | None = None) -> tuple[Path, list[BundledDashboard]]:
    """The folder (``--dir`` or the shipped one) and its dashboards."""
    folder = dashboards_dir(explicit)
    return folder, load_dashboards(folder)
