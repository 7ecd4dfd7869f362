"""Starting and stopping the real servers the tests run (Prometheus, Alertmanager, Slurm)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def find_binary(env_var: str, *candidates: str) -> str | None:
    """``$env_var``, then each candidate (a path, or a name looked up on the PATH), the first
    that is an executable file; None when there is none."""
    for candidate in (os.environ.get(env_var), *candidates):
        if not candidate:
            continue
        path = candidate if os.sep in candidate else shutil.which(candidate)
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return path
    return None


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    """``predicate()``'s first true value, asked every ``poll_s``; an AssertionError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a server's log (for assertion messages); empty when it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_http_ready(
    process: subprocess.Popen[bytes], url: str, what: str, log_path: Path, timeout: float
) -> None:
    """Wait until ``url`` answers 200; raise with the log's tail when the process exits first
    or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with status {process.returncode} before it was ready:\n"
                f"{log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:g} s:\n{log_tail(log_path)}")


def stop_process(
    process: subprocess.Popen[bytes], grace_s: float = 10.0, *, group: bool = False
) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``. ``group``: signal the process's own process
    group (a daemon started with ``start_new_session``), and make sure nothing of it outlives it.
    """

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    if process.poll() is None:
        send(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            process.wait(timeout=grace_s)
    if group:
        send(signal.SIGKILL)
