"""ttar unpacker: the real procfs/node_exporter sysfs archives and the format's corner cases."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from ttar import unpack_ttar

from minder.core.errors import ValidationError

SHARED = (
    Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "sysfs-infiniband-fixtures"
)


def _real(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"shared fixture {path} is absent (read-only data beside the repo)")
    return path


def test_node_exporter_archive_unpacks_files_dirs_and_modes(tmp_path: Path) -> None:
    unpack_ttar(_real("node_exporter_sys_class_infiniband.ttar"), tmp_path)
    port = tmp_path / "sys/class/infiniband/mlx4_0/ports/1"
    assert (port / "counters/port_rcv_data").read_text() == "4631917\n"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "counters_ext/port_xmit_data_64").read_text() == "3733440\n"
    assert stat.S_IMODE((port / "state").stat().st_mode) == 0o644
    assert (
        stat.S_IMODE((tmp_path / "sys/class/infiniband/i40iw0/ports/1/link_layer").stat().st_mode)
        == 0o664
    )
    assert sorted(p.name for p in (tmp_path / "sys/class/infiniband").iterdir()) == [
        "i40iw0",
        "mlx4_0",
    ]


def test_procfs_archive_keeps_missing_final_newline_and_multiline_files(tmp_path: Path) -> None:
    unpack_ttar(str(_real("procfs_sys_class_infiniband.ttar")), tmp_path)
    root = tmp_path / "fixtures/sys/class/infiniband"
    # "0a7f:bc12:45ef:d23bEOF": the file has no trailing newline.
    assert (root / "mlx5_0/node_guid").read_bytes() == b"0a7f:bc12:45ef:d23b"
    # "Lines: 2" with an empty second line.
    assert (root / "mlx4_0/ports/2/link_layer").read_bytes() == b"InfiniBand\n\n"
    assert (root / "mlx5_0/ports/1/hw_counters/req_cqe_error").read_text() == "3481\n"
    assert len(list(root.glob("*/ports/*/counters/*"))) == 17 + 17 * 2 + 21


def test_text_with_nullbytes_escapes_symlinks_empty_files_and_late_dir_modes(
    tmp_path: Path,
) -> None:
    archive = "\n".join(
        [
            "# Archive created by hand",
            "Directory: top",
            "Mode: 555",
            "# ttar - - -",
            "Path: top/nul",
            "Lines: 2",
            "aNULLBYTEbNULLBYTE",
            r"literal \NULLBYTE and \EOF stay textEOF",
            "Mode: 600",
            "Path: top/empty",
            "Lines: 0",
            "Mode: 644",
            "Path: top/link",
            "SymlinkTo: nul",
            "",
        ]
    )
    unpack_ttar(archive, tmp_path)
    top = tmp_path / "top"
    assert (top / "nul").read_bytes() == b"a\0b\0\nliteral NULLBYTE and EOF stay text"
    assert stat.S_IMODE((top / "nul").stat().st_mode) == 0o600
    assert (top / "empty").read_bytes() == b""
    assert (top / "link").is_symlink()
    assert (top / "link").read_bytes() == (top / "nul").read_bytes()
    # The read-only folder mode is applied after its content was written.
    assert stat.S_IMODE(top.stat().st_mode) == 0o555
    top.chmod(0o755)


def test_a_path_archived_twice_is_replaced(tmp_path: Path) -> None:
    unpack_ttar("Path: f\nLines: 1\nold\nPath: f\nLines: 1\nnew\n", tmp_path)
    assert (tmp_path / "f").read_text() == "new\n"


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        ("Path: a\nLines: 1\nx\nBogus: 1\n", "unknown keyword 'Bogus'"),
        ("Path: a\nLines: 3\nx\n", "archive ends inside"),
        ("Path: a\nLines: many\nx\n", "Lines 'many' is not a count"),
        ("Path: a\nLines: -1\n", "Lines '-1' is not a count"),
        ("Path: a\nLines: 1\nx\nMode: rw\n", "Mode 'rw' is not an octal"),
        ("Lines: 1\nx\n", "comes before any 'Path:'"),
        ("Path: ../evil\nLines: 1\nx\n", "'../evil' is not allowed"),
        ("Path: /etc/evil\nLines: 1\nx\n", "'/etc/evil' is not allowed"),
        ("just some text\nsecond line\n", "is not a ttar header"),
        ("Path: up\nSymlinkTo: ..\nPath: up/evil\nLines: 1\nx\n", "leads outside"),
    ],
)
def test_bad_archives_are_refused_naming_the_line(
    tmp_path: Path, archive: str, message: str
) -> None:
    with pytest.raises(ValidationError, match="ttar line") as info:
        unpack_ttar(archive, tmp_path / "out")
    assert message in str(info.value)
    assert not (tmp_path / "evil").exists()
