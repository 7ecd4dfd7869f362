"""The entry points' logging: rich on a terminal (imported at the first record), one plain line
per record elsewhere, one JSON object per record on request; libraries through the same handler
at WARNING and above, kafka-python's reconnect storm shown once a minute."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap

import pytest

from minder.logging_setup import KafkaConnectionErrors, resolve_format

ISO_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: "
)

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from minder.logging_setup import configure_logging

    configure_logging(sys.argv[1], sys.argv[2])
    logging.getLogger("quiet").debug("below the level")
    before = "rich.logging" in sys.modules
    # a library's own handler (uvicorn's default config adds one): ours must replace it
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.addHandler(logging.StreamHandler(sys.stdout))
    uvicorn.propagate = False
    configure_logging(sys.argv[1], sys.argv[2])  # the service configures after the CLI root
    logging.getLogger("kafka.conn").info("kafka chatter at INFO")
    logging.getLogger("uvicorn.error").warning("uvicorn warns")
    logging.getLogger("minder.service.engine").info(
        "ALERT %s job=%s", "a1", "job-7", extra={"job": "job-7", "machine": "gpu-3"}
    )
    logging.getLogger("minder.service.engine").info("job %s idle: dropped", "job-9")
    logging.getLogger("minder.x").info("two\\nlines")
    try:
        raise ValueError("the cause")
    except ValueError:
        logging.getLogger("loud").exception("something %s", "failed")
    print(before, "rich.logging" in sys.modules)
    """
)


def _run(level: str, kind: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, level, kind],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_rich_is_imported_at_the_first_record_and_writes_it_to_stderr() -> None:
    done = _run("WARNING", "rich")
    assert done.stdout.split() == ["False", "True"]
    assert "something failed" in done.stderr and "ERROR" in done.stderr
    assert "ValueError" in done.stderr and "the cause" in done.stderr  # the traceback, by rich
    assert "below the level" not in done.stderr
    assert "uvicorn warns" in done.stderr  # through our handler, not uvicorn's own


def test_auto_without_a_terminal_writes_one_plain_line_per_record() -> None:
    done = _run("INFO", "auto")  # stderr is a pipe
    assert done.stdout.split() == ["False", "False"]  # rich never imported
    lines = done.stderr.splitlines()
    assert len(lines) == 5, done.stderr  # uvicorn, the alert, the idle job, two lines, exception
    for line in lines:
        assert ISO_LINE.match(line), line
    assert "kafka chatter" not in done.stderr  # libraries: WARNING and above only
    assert " WARNING uvicorn.error: uvicorn warns" in lines[0]
    assert lines[3].endswith("minder.x: two\\nlines")
    assert " ERROR loud: something failed\\nTraceback (most recent call last):" in lines[4]
    assert lines[4].endswith("ValueError: the cause")


def test_json_writes_one_object_per_record_with_job_and_machine() -> None:
    done = _run("INFO", "json")
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [r["logger"] for r in records] == [
        "uvicorn.error",
        "minder.service.engine",
        "minder.service.engine",
        "minder.x",
        "loud",
    ]
    for record in records:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
        assert record["level"] in {"INFO", "WARNING", "ERROR"}
    alert, idle, two, failed = records[1:]
    assert alert["message"] == "ALERT a1 job=job-7"
    assert (alert["job"], alert["machine"]) == ("job-7", "gpu-3")
    assert idle["job"] == "job-9" and "machine" not in idle  # "job %s: …" messages
    assert two["message"] == "two\nlines" and "job" not in two
    assert failed["level"] == "ERROR" and failed["exception"].endswith("ValueError: the cause")


def _record(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_kafka_connection_errors_are_shown_once_per_window_with_the_count_left_out() -> None:
    now = [0.0]
    kept = KafkaConnectionErrors(window_s=60, clock=lambda: now[0])
    storm = [
        ("kafka.net.transport", "%s: socket disconnected", "<KafkaTCPTransport>"),
        ("kafka.net.manager", "Connection failed: %s", "KafkaConnectionError: 111 ECONNREFUSED"),
        ("kafka.cluster", "No node available for metadata refresh - backoff/retry"),
    ]
    shown = []
    for second in range(30):  # a 30-second broker restart: 3 records a second
        now[0] = float(second)
        for name, msg, *args in storm:
            record = _record(name, msg, *args)
            if kept.filter(record):
                shown.append(record.getMessage())
    assert shown == [
        "<KafkaTCPTransport>: socket disconnected (Kafka connection errors are shown once per 60 s)"
    ]
    now[0] = 61.0
    later = _record("kafka.net.manager", "Connection failed: %s", "ECONNREFUSED")
    assert kept.filter(later)
    assert later.getMessage().endswith("; 89 left out since the last one)")
    # other kafka-python records, and everyone else's, pass untouched
    other = _record("kafka.coordinator", "Heartbeat: local member_id was not recognized")
    ours = _record("minder.stream.consumer", "Connection failed: %s", "x")
    assert kept.filter(other) and other.getMessage().endswith("recognized")
    # a request its closing client cancelled: a clean stop, no error
    assert not kept.filter(_record("kafka.cluster", "Metadata refresh: failed %s", "Cancelled"))
    assert kept.filter(ours) and ours.getMessage() == "Connection failed: x"


def test_unknown_formats_are_refused_and_auto_follows_the_stream() -> None:
    with pytest.raises(ValueError, match="expected auto, rich, plain, json"):
        resolve_format("xml")

    class Terminal:
        def isatty(self) -> bool:
            return True

    assert resolve_format("auto", Terminal()) == "rich"  # type: ignore[arg-type]
    assert resolve_format("AUTO", sys.stdin if not sys.stdin.isatty() else None) in {
        "rich",
        "plain",
    }
    assert resolve_format("json") == "json"


CRASHES = textwrap.dedent(
    """
    import threading
    from minder.logging_setup import configure_logging

    configure_logging("INFO", "plain")

    def crash() -> None:
        raise AttributeError("'NoneType' object has no attribute 'poll'")

    worker = threading.Thread(target=crash, name="kafka-io")
    worker.start()
    worker.join()

    class Client:
        def __del__(self) -> None:
            raise AttributeError("'NoneType' object has no attribute 'close'")

    Client()
    """
)


def test_a_crashed_thread_and_a_failing_finaliser_are_one_record_each() -> None:
    """Python prints these past every handler; as records they keep the one-line promise."""
    done = subprocess.run(
        [sys.executable, "-c", CRASHES],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    thread, finaliser = lines
    assert ISO_LINE.match(thread) and " ERROR minder: uncaught exception in thread kafka-io\\n" in (
        thread
    )
    assert thread.endswith("AttributeError: 'NoneType' object has no attribute 'poll'")
    assert ISO_LINE.match(finaliser) and "Exception ignored in" in finaliser
    assert finaliser.endswith("AttributeError: 'NoneType' object has no attribute 'close'")
