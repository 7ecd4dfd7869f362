"""The node agent built from its options: the sources and the flight-recorder watcher
(``minder agent`` itself runs in tests/minder/cli/test_cli_agent.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minder.agent.assembly import build_fr_watcher, build_sources


def test_build_sources_follows_the_options(tmp_path: Path) -> None:
    sources = build_sources(sysfs_root=tmp_path, probe_address=None, nvml=False)
    try:
        assert [s.name for s in sources] == ["rdma", "ethtool", "host"]
    finally:
        for s in sources:
            s.close()
    sources = build_sources(
        sysfs_root=tmp_path,
        ethtool_command=None,
        dcgm_url="http://127.0.0.1:1/metrics",
        nccl_dir=tmp_path,
        probe_address="127.0.0.1:0",
    )
    try:
        assert [s.name for s in sources] == ["dcgm", "rdma", "host", "nccl", "probe"]
    finally:
        for s in sources:
            s.close()


def test_build_fr_watcher_follows_the_options_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collectors.fr_watch import DEFAULT_POLL_S

    watcher = build_fr_watcher(f"{tmp_path}/dumps/trace_", "n7", 2.0)
    assert (watcher.directory, watcher.file_prefix) == (tmp_path / "dumps", "trace_")
    assert (watcher.node, watcher.poll_s) == ("n7", 2.0)
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", f"{tmp_path}/fr/nccl_trace_rank_")
    default = build_fr_watcher(None, "n7")
    assert default.poll_s == DEFAULT_POLL_S
    assert (default.directory, default.file_prefix) == (tmp_path / "fr", "nccl_trace_rank_")
