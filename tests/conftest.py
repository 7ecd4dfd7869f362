"""Shared by every test folder: this folder is on ``sys.path`` (pytest puts a root conftest's
folder there), so helpers such as :mod:`server_process` import from any test module."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hang_jobs import HangDumps


@pytest.fixture(scope="session")
def real_hang_dumps(tmp_path_factory: pytest.TempPathFactory) -> HangDumps:
    """Real hung gloo jobs' flight-recorder dumps (:mod:`hang_jobs`), by case name: each case
    runs once per session, when a test first asks for it (``real_hang_dumps["skip"]``)."""
    torch = pytest.importorskip("torch", reason="real hang dumps need torch (torch.distributed)")
    if not torch.distributed.is_available():
        pytest.skip("real hang dumps need a torch built with torch.distributed (gloo)")
    from hang_jobs import HangDumps

    return HangDumps(tmp_path_factory.mktemp("hang_jobs"))
