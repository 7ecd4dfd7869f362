"""Unpack a ttar plain-text archive (the format of prometheus/procfs' sysfs fixtures) into a folder.

ttar (github.com/ideaship/ttar) stores text files, folders and symlinks as blocks::

    Directory: sys/class/infiniband        # make a folder
    Mode: 755
    Path: sys/class/infiniband/mlx5_0/fw_ver
    Lines: 1                               # this many content lines follow
    14.28.2006
    Mode: 644
    Path: sys/class/infiniband/mlx5_0/device
    SymlinkTo: ../../../devices/pci0000:00/0000:00:02.0

Lines starting with ``#`` between blocks are comments. Inside content lines ``NULLBYTE`` stands
for a NUL byte, a trailing ``EOF`` means the file does not end with a newline, and a backslash
escapes a literal ``NULLBYTE`` or ``EOF``. The node-agent tests and benchmark unpack the real
``/sys/class/infiniband`` fixtures with it; it is not meant for untrusted archives beyond
refusing paths that leave the destination.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from minder.core.errors import ValidationError

__all__ = ["unpack_ttar"]

_ESCAPES = re.compile(r"\\(NULLBYTE|EOF)|NULLBYTE|EOF$")


def _decode_line(line: str) -> str:
    r"""Turn one archived content line back into file text (newline included unless ``EOF``)."""
    newline = "\n"

    def replace(match: re.Match[str]) -> str:
        nonlocal newline
        if match.group(1) is not None:  # escaped keyword: literal text
            return match.group(1)
        if match.group(0) == "NULLBYTE":
            return "\0"
        newline = ""  # unescaped trailing EOF: the file has no final newline
        return ""

    return _ESCAPES.sub(replace, line) + newline


def _inside(dest: Path, relative: str, line_no: int) -> Path:
    """``dest / relative``, refusing absolute paths and ones that climb out of ``dest``."""
    parts = Path(relative).parts
    if not relative or Path(relative).is_absolute() or ".." in parts:
        raise ValidationError(
            f"ttar line {line_no}: path {relative!r} is not allowed: expected a relative path "
            "without '..'"
        )
    target = dest / relative
    # A symlink unpacked earlier could redirect a later path outside dest.
    if not target.parent.resolve().is_relative_to(dest.resolve()):
        raise ValidationError(
            f"ttar line {line_no}: path {relative!r} leads outside {str(dest)!r} through a symlink"
        )
    return target


def _remove(target: Path) -> None:
    """Make room for an entry, as ttar does when a path is archived twice."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        target.rmdir()  # only an empty folder may be replaced by a file or link


def unpack_ttar(text_or_path: str | os.PathLike[str], dest: Path) -> None:
    """Unpack a ttar archive into ``dest`` (created if needed).

    Parameters
    ----------
    text_or_path
        The archive text (a ``str`` holding a newline) or the path of an archive file.
    dest
        Folder that receives the archive's paths (``dest/sys/class/...`` for node_exporter's
        fixture, ``dest/fixtures/sys/class/...`` for procfs').

    Raises
    ------
    ValidationError
        On an unknown keyword, a block without ``Path:``, an archive that ends inside a file,
        a bad ``Lines:``/``Mode:`` value or a path leaving ``dest``; the message names the line.
    """
    if isinstance(text_or_path, str) and "\n" in text_or_path:
        text = text_or_path
    else:
        text = Path(text_or_path).read_text(encoding="utf-8", errors="surrogateescape")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    lines = text.split("\n")
    # Folder modes are applied last, deepest first, so a read-only folder cannot block its content.
    dir_modes: list[tuple[Path, int]] = []
    current: Path | None = None
    current_is_dir = False
    i = 0
    while i < len(lines):
        line = lines[i]
        line_no = i + 1
        i += 1
        if not line.strip() or line.startswith("#"):
            continue
        keyword, sep, value = line.partition(": ")
        if not sep:
            raise ValidationError(
                f"ttar line {line_no}: {line[:80]!r} is not a ttar header: expected "
                "'Path: ', 'Directory: ', 'Lines: ', 'Mode: ', 'SymlinkTo: ' or a '#' comment"
            )
        if keyword == "Directory":
            current, current_is_dir = _inside(dest, value, line_no), True
            current.mkdir(parents=True, exist_ok=True)
        elif keyword == "Path":
            current, current_is_dir = _inside(dest, value, line_no), False
            _remove(current)
        elif current is None:
            raise ValidationError(
                f"ttar line {line_no}: {keyword!r} comes before any 'Path:' or 'Directory:'"
            )
        elif keyword == "Lines":
            try:
                count = int(value)
            except ValueError:
                count = -1
            if count < 0:
                raise ValidationError(
                    f"ttar line {line_no}: Lines {value!r} is not a count: expected an integer >= 0"
                )
            if i + count > len(lines):
                raise ValidationError(
                    f"ttar line {line_no}: archive ends inside {str(current)!r}: expected "
                    f"{count} content lines, {len(lines) - i} left"
                )
            content = "".join(_decode_line(body) for body in lines[i : i + count])
            i += count
            current.parent.mkdir(parents=True, exist_ok=True)
            with current.open("w", encoding="utf-8", errors="surrogateescape", newline="") as fh:
                fh.write(content)
        elif keyword == "SymlinkTo":
            current.parent.mkdir(parents=True, exist_ok=True)
            current.symlink_to(value)
        elif keyword == "Mode":
            try:
                mode = int(value, 8)
            except ValueError:
                raise ValidationError(
                    f"ttar line {line_no}: Mode {value!r} is not an octal permission such as 644"
                ) from None
            if current_is_dir:
                dir_modes.append((current, mode))
            elif not current.is_symlink():
                current.chmod(mode)
        else:
            raise ValidationError(
                f"ttar line {line_no}: unknown keyword {keyword!r}: expected Path, Directory, "
                "Lines, Mode or SymlinkTo"
            )
    for folder, mode in sorted(dir_modes, key=lambda item: len(item[0].parts), reverse=True):
        folder.chmod(mode)
