"""The entry points' logging: rich on stderr, imported only once something is logged."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from minder.logging_setup import configure_logging

    configure_logging("WARNING")
    logging.getLogger("quiet").info("below the level")
    before = "rich.logging" in sys.modules
    try:
        raise ValueError("the cause")
    except ValueError:
        logging.getLogger("loud").exception("something %s", "failed")
    print(before, "rich.logging" in sys.modules)
    """
)


def test_rich_is_imported_at_the_first_record_and_writes_it_to_stderr() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.split() == ["False", "True"]
    assert "something failed" in done.stderr and "ERROR" in done.stderr
    assert "ValueError" in done.stderr and "the cause" in done.stderr  # the traceback, by rich
    assert "below the level" not in done.stderr
