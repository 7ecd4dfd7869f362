"""What-if endpoints: upload or server path → background analysis → stored report, gauge, listing."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from api_testing import AUTH, TOKEN
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from minder.api import create_app
from minder.core.errors import ValidationError
from minder.storage import SessionFactory

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
WIA = DATA / "bytedance-straggler-wia"
KINETO = DATA / "hta-kineto-traces"
POLL_TIMEOUT_S = 60.0


def need(path: Path) -> Path:
    """``path``, or skip the test when the shared data is not next to the repository."""
    if not path.exists():
        pytest.skip(f"shared test data {path} is absent (expected ../shared/data beside the repo)")
    return path.resolve()


def st_files() -> list[tuple[str, tuple[str, bytes]]]:
    """The ST trace and its meta as multipart file fields."""
    return [
        ("files", ("trace-ST.parquet", need(WIA / "trace-ST.parquet").read_bytes())),
        ("meta", ("meta-ST.yaml", need(WIA / "meta-ST.yaml").read_bytes())),
    ]


@contextmanager
def serving(
    sessions: SessionFactory, registry: CollectorRegistry, **options: Any
) -> Iterator[TestClient]:
    """A client of an app made with ``options``: with the token :data:`TOKEN`, sent with every
    request, unless ``options`` choose the token or open access."""
    headers = {}
    if "api_token" not in options and not options.get("open_access"):
        options["api_token"] = TOKEN
        headers = AUTH
    with TestClient(create_app(sessions, registry=registry, **options), headers=headers) as client:
        yield client


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path / "work"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An allowed root holding ``st/`` (the ST trace and meta) and ``bad.parquet``."""
    directory = tmp_path / "root"
    (directory / "st").mkdir(parents=True)
    for name in ("trace-ST.parquet", "meta-ST.yaml"):
        shutil.copy(need(WIA / name), directory / "st" / name)
    pd.DataFrame({"rank": [0, 1], "duration": [1.0, 2.0]}).to_parquet(directory / "bad.parquet")
    return directory


@pytest.fixture
def client(
    sessions: SessionFactory, registry: CollectorRegistry, root: Path, workdir: Path
) -> Iterator[TestClient]:
    with serving(sessions, registry, whatif_roots=[root], whatif_workdir=workdir) as test_client:
        yield test_client


def submitted(response: Any) -> str:
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "pending"
    assert body["links"] == {"self": f"/api/v1/whatif/{body['id']}"}
    assert response.headers["location"] == body["links"]["self"]
    report_id: str = body["id"]
    return report_id


def finished(client: TestClient, report_id: str) -> dict[str, Any]:
    """Poll the report until it is done or failed."""
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while True:
        response = client.get(f"/api/v1/whatif/{report_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        if body["status"] in ("done", "failed"):
            return body
        assert body["status"] in ("pending", "running")
        assert time.monotonic() < deadline, f"report {report_id} still {body['status']}"
        time.sleep(0.02)


def metric_lines(client: TestClient, name: str) -> list[str]:
    return [line for line in client.get("/metrics").text.splitlines() if line.startswith(name)]


def test_uploaded_st_trace_is_analysed_in_the_background(client: TestClient, workdir: Path) -> None:
    report_id = submitted(
        client.post("/api/v1/whatif", files=st_files(), data={"what_ifs": ["pp-comm:free"]})
    )
    body = finished(client, report_id)

    assert body["status"] == "done", body["error"]
    golden = json.loads(need(WIA / "result-ST.json").read_text())["blocking_slowdown"]
    assert body["slowdown"] == pytest.approx(golden, rel=0.01)
    assert body["verdict"] == "stage"
    assert body["job"] == "ST"  # the meta's trial name
    assert body["error"] is None
    assert body["source"].startswith("upload: trace-ST.parquet + meta-ST.yaml (")
    assert body["created_at"] <= body["started_at"] <= body["finished_at"]
    report = body["report"]
    assert list(report)[:11] == [
        "slowdown", "waste", "model_error", "by_optype", "by_dp_rank", "by_stage", "by_worker",
        "mw", "ms", "verdict", "per_step",
    ]  # fmt: skip
    assert report["slowdown"] == body["slowdown"]
    assert report["verdict"]["cause"] == "stage"
    assert report["verdict"]["target"] == {"stage": 3}
    assert [w["name"] for w in report["whatifs"]] == ["pp-comm:free"]

    [gauge] = metric_lines(client, "minder_whatif_slowdown{")
    assert gauge.startswith('minder_whatif_slowdown{job_id="ST"} ')
    assert float(gauge.split()[-1]) == pytest.approx(body["slowdown"])
    counts = metric_lines(client, "minder_whatif_reports_total")
    for status, count in (("pending", 1), ("running", 1), ("done", 1), ("failed", 0)):
        assert f'minder_whatif_reports_total{{status="{status}"}} {count}.0' in counts
    assert not any(workdir.iterdir())  # the upload is removed once analysed


def test_a_named_job_labels_the_report_and_the_gauge(client: TestClient) -> None:
    report_id = submitted(client.post("/api/v1/whatif", files=st_files(), data={"job": "llm-7"}))
    assert finished(client, report_id)["job"] == "llm-7"
    assert metric_lines(client, "minder_whatif_slowdown{")[0].startswith(
        'minder_whatif_slowdown{job_id="llm-7"} '
    )


def test_kineto_traces_of_each_rank_can_be_uploaded(client: TestClient) -> None:
    files = [
        ("files", (name, need(KINETO / name).read_bytes()))
        for name in ("trace_filter_sampled_rank-0.json.gz", "trace_filter_sampled_rank-1.json.gz")
    ]
    report_id = submitted(client.post("/api/v1/whatif", files=files, data={"job": "hta"}))
    body = finished(client, report_id)
    assert body["status"] == "done", body["error"]
    assert body["report"]["meta"]["dp_size"] == 2
    assert body["slowdown"] >= 1.0


def test_malformed_parquet_fails_with_the_error_stored(client: TestClient, workdir: Path) -> None:
    broken = pd.DataFrame({"rank": [0, 1], "duration": [1.0, 2.0]})
    target = workdir.parent / "broken.parquet"
    broken.to_parquet(target)
    files = [("files", ("broken.parquet", target.read_bytes()))]
    body = finished(client, submitted(client.post("/api/v1/whatif", files=files)))

    assert body["status"] == "failed"
    assert "missing column 'dp_rank'" in body["error"]
    assert body["report"] is None and body["slowdown"] is None
    not_parquet = [("files", ("fake.parquet", b"not parquet at all"))]
    body = finished(client, submitted(client.post("/api/v1/whatif", files=not_parquet)))
    assert body["status"] == "failed"
    assert body["error"].startswith("fake.parquet: cannot read Parquet")  # no server directory
    assert 'minder_whatif_reports_total{status="failed"} 2.0' in metric_lines(
        client, "minder_whatif_reports_total"
    )
    assert metric_lines(client, "minder_whatif_slowdown{") == []
    assert not any(workdir.iterdir())


@pytest.mark.parametrize(
    ("files", "data", "message"),
    [
        ([("files", ("notes.txt", b"hello"))], {}, "'notes.txt' has an unsupported type"),
        (
            [("files", ("a.parquet", b"x")), ("files", ("rank-0.json", b"{}"))],
            {},
            "mixed inputs",
        ),
        ([("files", ("a.parquet", b"x")), ("files", ("b.parquet", b"x"))], {}, "2 Parquet"),
        (
            [("files", ("a.parquet", b"x")), ("m", ("a.yaml", b"x")), ("m", ("b.yml", b"x"))],
            {},
            "2 meta files given",
        ),
        ([("meta", ("a.yaml", b"x"))], {}, "no trace file given"),
        ([("files", ("a.parquet", b"x"))], {"colour": "red"}, "unknown form field 'colour'"),
        ([("files", ("a.parquet", b"x"))], {"what_ifs": "warp:9"}, "what-if 'warp:9'"),
        ([("files", ("a.parquet", b"x"))], {"job": ["a", "b"]}, "'job' must be given once"),
    ],
)
def test_bad_uploads_are_refused_at_submission(
    client: TestClient,
    workdir: Path,
    files: list[tuple[str, tuple[str, bytes]]],
    data: dict[str, Any],
    message: str,
) -> None:
    response = client.post("/api/v1/whatif", files=files, data=data)
    assert response.status_code == 422, response.text
    assert message in json.dumps(response.json()["detail"])
    assert client.get("/api/v1/whatif").json()["total"] == 0  # nothing stored
    assert not any(workdir.iterdir())  # nothing left on disk


def test_oversized_uploads_are_refused_with_413(
    sessions: SessionFactory, registry: CollectorRegistry, workdir: Path
) -> None:
    with serving(sessions, registry, whatif_workdir=workdir, max_upload_bytes=10_000) as client:
        response = client.post("/api/v1/whatif", files=st_files())
        assert response.status_code == 413
        assert re.fullmatch(
            r"the upload is \d+ bytes: this server accepts at most 10000 bytes",
            response.json()["detail"],
        )
        assert client.get("/api/v1/whatif").json()["total"] == 0
        assert not any(workdir.iterdir())


def test_streamed_uploads_are_cut_off_at_the_limit(
    sessions: SessionFactory, registry: CollectorRegistry, workdir: Path
) -> None:
    """Without a Content-Length the limit holds while the body streams in."""
    boundary = "minder-test-boundary"

    def body() -> Iterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
            'filename="big.parquet"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        for _ in range(64):
            yield b"\0" * 1024
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    with serving(sessions, registry, whatif_workdir=workdir, max_upload_bytes=10_000) as client:
        response = client.post("/api/v1/whatif", content=body(), headers=headers)
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == (
            "the upload is more than 10000 bytes: this server accepts at most 10000 bytes"
        )
        assert not any(workdir.iterdir())
        garbage = client.post("/api/v1/whatif", content=b"\r\n--nope\r\n\r\n", headers=headers)
        assert garbage.status_code == 422
        no_boundary = client.post(
            "/api/v1/whatif", content=b"x", headers={"content-type": "multipart/form-data"}
        )
        assert no_boundary.status_code == 422
        assert "without a boundary" in no_boundary.json()["detail"]
        assert client.get("/api/v1/whatif").json()["total"] == 0


def test_other_content_types_are_refused_with_415(client: TestClient) -> None:
    response = client.post(
        "/api/v1/whatif", content=b"path=x", headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415
    assert "'text/plain' is not accepted" in response.json()["detail"]


def test_server_paths_under_the_root_are_analysed(client: TestClient, root: Path) -> None:
    requests = [
        {"path": str(root / "st" / "trace-ST.parquet")},  # absolute, meta beside it
        {"path": "st/trace-ST.parquet", "meta": "st/meta-ST.yaml", "job": "named"},  # relative
        {"path": "st"},  # a directory: its trace, and its one YAML as the meta
        {"path": "st/*.parquet", "what_ifs": ["dp-comm:free"]},  # a glob
    ]
    ids = [submitted(client.post("/api/v1/whatif", json=body)) for body in requests]
    bodies = [finished(client, report_id) for report_id in ids]
    for body in bodies:
        assert body["status"] == "done", body["error"]
        assert body["verdict"] == "stage"
        # server files by their path under the root: the server's layout stays out
        assert body["source"].startswith("path: st/trace-ST.parquet")
        assert str(root) not in body["source"]
    assert bodies[0]["slowdown"] == pytest.approx(bodies[1]["slowdown"])
    assert [b["job"] for b in bodies] == ["ST", "named", "ST", "ST"]
    assert bodies[1]["source"].endswith(" + st/meta-ST.yaml")
    assert (root / "st" / "trace-ST.parquet").exists()  # server files are never removed


def test_server_paths_outside_the_root_are_refused_with_403(
    client: TestClient, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.parquet"
    shutil.copy(root / "st" / "trace-ST.parquet", outside)
    (root / "link.parquet").symlink_to(outside)
    for path in (str(outside), "../outside.parquet", "link.parquet", "../*.parquet"):
        response = client.post("/api/v1/whatif", json={"path": path})
        assert response.status_code == 403, (path, response.text)
        assert repr(path) in response.json()["detail"]
        assert "outside the directories this server may read" in response.json()["detail"]
    response = client.post(
        "/api/v1/whatif", json={"path": "st/trace-ST.parquet", "meta": str(outside)}
    )
    assert response.status_code == 403
    assert client.get("/api/v1/whatif").json()["total"] == 0


def test_globs_cannot_probe_outside_the_root_and_nul_bytes_are_refused(
    client: TestClient, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("x")
    for probe in ("st/../../secret.tx[t]", "*/../../secret.txt", "*/../../absent.txt"):
        response = client.post("/api/v1/whatif", json={"path": probe})
        assert response.status_code == 403, (probe, response.text)
        assert "secret" not in response.json()["detail"].replace(repr(probe), "")
    response = client.post("/api/v1/whatif", json={"path": "st/trace\u0000.parquet"})
    assert response.status_code == 422 and "NUL" in response.json()["detail"]


def test_missing_or_unusable_server_paths_are_refused_with_422(client: TestClient) -> None:
    for body, message in (
        ({"path": "st/nope.parquet"}, "path 'st/nope.parquet' does not exist on the server"),
        ({"path": "st/*.json"}, "path 'st/*.json' matches no file"),
        ({"path": "st/meta-ST.yaml"}, "names the meta file 'meta-ST.yaml'"),
        ({"path": "st", "meta": "st/trace-ST.parquet"}, "is not a .yaml/.yml file"),
        ({"path": "st", "what_ifs": ["nonsense"]}, "what-if 'nonsense'"),
    ):
        response = client.post("/api/v1/whatif", json=body)
        assert response.status_code == 422, (body, response.text)
        assert message in response.json()["detail"]
    response = client.post("/api/v1/whatif", json={"file": "st"})
    assert response.status_code == 422
    assert {tuple(e["loc"]) for e in response.json()["detail"]} == {
        ("body", "path"),
        ("body", "file"),
    }


def test_a_malformed_server_trace_fails_with_the_error_stored(client: TestClient) -> None:
    body = finished(client, submitted(client.post("/api/v1/whatif", json={"path": "bad.parquet"})))
    assert body["status"] == "failed"
    assert "missing column 'dp_rank'" in body["error"]


def test_server_paths_are_refused_when_no_root_is_configured(
    sessions: SessionFactory, registry: CollectorRegistry
) -> None:
    with serving(sessions, registry) as client:
        response = client.post("/api/v1/whatif", json={"path": "/tmp/trace.parquet"})
    assert response.status_code == 403
    assert "server paths are disabled" in response.json()["detail"]


def test_listing_pages_newest_first_without_report_bodies(client: TestClient) -> None:
    ids = [
        submitted(client.post("/api/v1/whatif", json={"path": "st", "job": job}))
        for job in ("a", "b", "a")
    ]
    for report_id in ids:
        finished(client, report_id)
    failed = submitted(client.post("/api/v1/whatif", json={"path": "bad.parquet", "job": "c"}))
    finished(client, failed)
    newest_first = [failed, *ids[::-1]]

    body = client.get("/api/v1/whatif").json()
    assert (body["total"], body["limit"], body["offset"]) == (4, 50, 0)
    assert [item["id"] for item in body["items"]] == newest_first
    assert all("report" not in item for item in body["items"])
    assert body["items"][1]["slowdown"] > 1 and body["items"][1]["verdict"] == "stage"

    first = client.get("/api/v1/whatif", params={"limit": 3}).json()
    second = client.get("/api/v1/whatif", params={"limit": 3, "offset": 3}).json()
    assert [i["id"] for i in first["items"] + second["items"]] == newest_first
    assert second["total"] == 4 and len(second["items"]) == 1

    by_job = client.get("/api/v1/whatif", params={"job": "a"}).json()
    assert [i["id"] for i in by_job["items"]] == [ids[2], ids[0]]
    by_status = client.get("/api/v1/whatif", params={"status": "failed"}).json()
    assert [i["id"] for i in by_status["items"]] == [failed]
    assert client.get("/api/v1/whatif", params={"limit": 0}).status_code == 422
    assert client.get("/api/v1/whatif", params={"status": "finished"}).status_code == 422


def test_unknown_report_is_404_naming_it(client: TestClient) -> None:
    response = client.get("/api/v1/whatif/no-such-report")
    assert response.status_code == 404
    assert response.json() == {"detail": "no what-if report with id 'no-such-report'"}


def test_submission_needs_the_token_when_one_is_set(
    sessions: SessionFactory, registry: CollectorRegistry, root: Path
) -> None:
    with serving(sessions, registry, whatif_roots=[root], api_token="s3cret") as client:
        assert client.post("/api/v1/whatif", json={"path": "st"}).status_code == 401
        client.headers["Authorization"] = "Bearer s3cret"  # reads need it too
        response = client.post("/api/v1/whatif", json={"path": "st"})
        assert finished(client, submitted(response))["status"] == "done"


def test_apps_sharing_a_registry_share_the_whatif_metrics(
    sessions: SessionFactory, registry: CollectorRegistry, root: Path
) -> None:
    for _ in range(2):  # a second app on the same registry must not register the names again
        with serving(sessions, registry, whatif_roots=[root]) as client:
            finished(client, submitted(client.post("/api/v1/whatif", json={"path": "st"})))
    counts = metric_lines(client, "minder_whatif_reports_total")
    assert 'minder_whatif_reports_total{status="done"} 2.0' in counts


def test_bad_app_options_are_refused(sessions: SessionFactory, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="is not a directory"):
        create_app(sessions, registry=CollectorRegistry(), whatif_roots=[tmp_path / "nope"])
    with pytest.raises(ValidationError, match="max_upload_bytes 0"):
        create_app(sessions, registry=CollectorRegistry(), max_upload_bytes=0)


def test_openapi_documents_the_whatif_endpoints(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    assert {"/api/v1/whatif", "/api/v1/whatif/{report_id}"} <= set(document["paths"])
    post = document["paths"]["/api/v1/whatif"]["post"]
    assert set(post["requestBody"]["content"]) == {"multipart/form-data", "application/json"}
    assert {"202", "403", "413", "415", "422"} <= set(post["responses"])
    assert {"WhatIfAccepted", "WhatIfReportOut", "WhatIfPage"} <= set(
        document["components"]["schemas"]
    )


def test_a_restarted_app_restores_each_jobs_latest_slowdown(
    sessions: SessionFactory, root: Path
) -> None:
    with serving(sessions, CollectorRegistry(), whatif_roots=[root]) as client:
        report = finished(
            client, submitted(client.post("/api/v1/whatif", json={"path": "st", "job": "llm-9"}))
        )
    # A new process: a fresh registry, the same database.
    with serving(sessions, CollectorRegistry(), whatif_roots=[root]) as client:
        [gauge] = metric_lines(client, 'minder_whatif_slowdown{job_id="llm-9"}')
    assert float(gauge.split()[-1]) == pytest.approx(report["slowdown"])
