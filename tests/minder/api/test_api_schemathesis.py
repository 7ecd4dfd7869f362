"""Property-based checks of the API against its own OpenAPI document (schemathesis).

Schemathesis generates requests from ``/openapi.json`` for every operation, valid and invalid,
and they go to the ASGI app (a temporary SQLite database with two alerts, a what-if root, the
API token sent with every request). Each answer must not be a server error, and must conform to
the document: a documented status code, its content type and headers, and its schema. Examples
are bounded so the whole module takes well under a minute.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from api_testing import AUTH, TOKEN
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from prometheus_client import CollectorRegistry
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from minder.api import create_app
from minder.core.alert import Alert, AlertKind
from minder.core.hang import Culprit, CulpritReason, HangAnalysis
from minder.storage import record_alert, save_hang_analysis, session_factory
from minder.storage.testing import scratch_database

BASE_URL = "http://testserver"
MAX_EXAMPLES = 50
"""Examples per operation and mode (about 25 operations): some 20 s for the module."""

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """The API on a migrated SQLite file with two alerts and a hang analysis of job ``j1``, the
    token set and a what-if root."""
    directory = tmp_path_factory.mktemp("schemathesis")
    root = directory / "traces"
    root.mkdir()
    (root / "broken.parquet").write_bytes(b"not parquet")
    with scratch_database("sqlite", directory) as engine:
        sessions = session_factory(engine)
        with sessions.begin() as session:
            for machine, kind in (("m1", AlertKind.RULE), ("m2", AlertKind.SIMILARITY)):
                record_alert(
                    session,
                    Alert(
                        job="j1",
                        machine=machine,
                        kind=kind,
                        metric="gpu_xid_count",
                        score=7.5,
                        first_ts=1_700_000_000.0,
                        detected_ts=1_700_000_010.0,
                        devices=("gpu0",),
                        evidence={"rule": "xid", "values": [1.0, None]},
                    ),
                )
            culprit = Culprit(3, CulpritReason.NO_DUMP, "m1", "0", "default_pg", "nccl:all_reduce")
            hang = HangAnalysis(hung=True, culprits=(culprit,), analysed_ts=1_700_000_005.0)
            save_hang_analysis(session, "j1", hang, 1_700_000_006.0)
        application = create_app(
            sessions,
            registry=CollectorRegistry(),
            api_token=TOKEN,
            whatif_roots=[root],
            whatif_workdir=directory / "work",
        )
        yield application


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_conforms_to_the_openapi_document(
    app: FastAPI, mode: GenerationMode
) -> None:
    """Valid (positive) and invalid (negative) requests to every operation.

    Every operation is tried, and every failure reported, before the test fails. (Hypothesis is
    driven here rather than through schemathesis' pytest plugin, whose lazy loading does not
    work with this pytest; see :func:`send` for the transport.)
    """
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    tried = 0
    with TestClient(app) as client:
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), f"the OpenAPI document is invalid: {result.err()}"
            operation = result.ok()

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def check(case: Case) -> None:
                case.validate_response(send(client, case), checks=CHECKS, headers=AUTH)

            try:
                check()
            except Unsatisfiable:
                continue  # nothing to make invalid (no parameter, no body)
            except FailureGroup as exc:  # every operation's failure, not just the first
                failures.append(f"{operation.label}: {exc}")
            except Exception:  # raised by the app (the test client re-raises it): where
                failures.append(f"{operation.label}: {traceback.format_exc(limit=-8)}")
            tried += 1
    assert tried >= 20 if mode is GenerationMode.POSITIVE else tried >= 10, tried
    assert not failures, "\n\n".join(failures)


def send(client: TestClient, case: Case) -> httpx.Response:
    """Send ``case`` with the app's own test client (httpx).

    Schemathesis' own transport (requests) breaks on this environment's urllib3-future, so its
    serialised request is sent here instead; the checks then judge the httpx answer.
    """
    serialised = case.as_transport_kwargs(base_url=BASE_URL, headers=AUTH)
    assert not serialised.get("cookies"), "the API takes no cookie"
    request: dict[str, Any] = {
        key: serialised[key]
        for key in ("method", "url", "headers", "params", "json")
        if serialised.get(key) is not None
    }
    if serialised.get("files") is not None:  # requests sends str(value) of a number, httpx not
        request["files"] = [
            (name, (part[0], part[1] if isinstance(part[1], bytes | str) else str(part[1])))
            for name, part in serialised["files"]
        ]
    data = serialised.get("data")
    if isinstance(data, bytes | str):
        request["content"] = data
    elif data is not None:
        request["data"] = data
    built = client.build_request(**request)
    built.read()  # the checks read the request's body: a multipart stream must be read first
    return client.send(built)


def test_the_schema_names_the_secured_operations(app: FastAPI) -> None:
    """What the property test relies on: every change documents 401 and 403, every read 401."""
    document = app.openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if method in ("post", "put", "patch"):
                assert {"401", "403"} <= codes, (method, path)
            elif path.startswith("/api/v1/") and path not in (
                "/api/v1/health",
                "/api/v1/ready",
                "/api/v1/metrics",
            ):
                assert "401" in codes, (method, path)
