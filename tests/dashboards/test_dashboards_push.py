"""``minder dashboards push`` and ``list`` against a fake Grafana (tests/fake_grafana.py),
and the Grafana client behind them (:mod:`dashboards.grafana`).

The fake follows Grafana's documented HTTP API because no Grafana server can run here.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_grafana import FakeGrafana
from typer.testing import CliRunner

from dashboards.bundle import JSON_DIR as SHIPPED_DIR
from dashboards.bundle import DashboardError
from dashboards.grafana import folder_uid_for, parse_grafana_url, push_to_grafana
from minder.cli.dashboards import dashboards_app

pytest.importorskip("grafana_client", reason="grafana-client is not installed")

ROOT = Path(__file__).resolve().parents[2]
JSON_DIR = ROOT / "dashboards" / "json"
UIDS = {"minder-fleet", "minder-job", "minder-whatif", "minder-service", "minder-agents"}

runner = CliRunner()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    with FakeGrafana() as fake:
        yield fake


def _push(grafana: FakeGrafana, *args: str, env: dict[str, str] | None = None) -> Any:
    result = runner.invoke(
        dashboards_app,
        ["push", "--grafana-url", grafana.url, "--dir", str(JSON_DIR), *args],
        env=env,
    )
    return result


def _push_json(grafana: FakeGrafana, *args: str) -> dict[str, Any]:
    result = _push(grafana, "--token", grafana.token, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _one_line_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    assert lines[0].startswith("error: ")
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_first_push_creates_the_folder_and_every_dashboard(grafana: FakeGrafana) -> None:
    report = _push_json(grafana)

    assert report["folder"] == {"uid": "minder", "title": "Minder", "created": True}
    assert {d["uid"] for d in report["dashboards"]} == UIDS
    assert {d["status"] for d in report["dashboards"]} == {"created"}
    assert {d["version"] for d in report["dashboards"]} == {1}
    assert grafana.folders["minder"]["title"] == "Minder"
    assert set(grafana.dashboards) == UIDS
    assert set(grafana.dashboard_folders.values()) == {"minder"}

    # What Grafana's API documents for a new dashboard: id null, uid and title, the folder's
    # uid, overwrite, a message; and the token on every request.
    saves = grafana.calls("POST", "/api/dashboards/db")
    assert len(saves) == 5 and all(r.status == 200 for r in saves)
    for request in saves:
        body = request.body
        assert set(body) == {"dashboard", "folderUid", "overwrite", "message"}
        assert body["overwrite"] is True and body["folderUid"] == "minder"
        assert body["dashboard"]["id"] is None
        assert body["dashboard"]["uid"] in UIDS and body["dashboard"]["title"]
        assert "version" not in body["dashboard"]
        assert body["message"].startswith("minder dashboards push")
    assert grafana.calls("POST", "/api/folders")[0].body == {"title": "Minder", "uid": "minder"}
    assert {r.authorization for r in grafana.requests} == {f"Bearer {grafana.token}"}
    # The stored dashboards are the committed files.
    for path in JSON_DIR.glob("*.json"):
        committed = json.loads(path.read_text())
        stored = dict(grafana.dashboards[committed["uid"]])
        assert {k: v for k, v in stored.items() if k not in {"id", "version"}} == committed


def test_a_second_push_creates_and_saves_nothing(grafana: FakeGrafana) -> None:
    _push_json(grafana)
    before = len(grafana.requests)

    report = _push_json(grafana)

    assert report["folder"]["created"] is False
    assert {d["status"] for d in report["dashboards"]} == {"unchanged"}
    assert {d["version"] for d in report["dashboards"]} == {1}
    second = grafana.requests[before:]
    assert [r for r in second if r.method != "GET"] == []
    assert len(grafana.folders) == 1 and len(grafana.dashboards) == 5


def test_a_changed_dashboard_is_updated_in_place(grafana: FakeGrafana, tmp_path: Path) -> None:
    folder = tmp_path / "json"
    shutil.copytree(JSON_DIR, folder)
    first = _push_json(grafana, "--dir", str(folder))
    ids = {uid: d["id"] for uid, d in grafana.dashboards.items()}
    path = folder / "minder-fleet.json"
    data = json.loads(path.read_text())
    data["description"] = "changed by hand"
    path.write_text(json.dumps(data))

    report = _push_json(grafana, "--dir", str(folder))

    status = {d["uid"]: (d["status"], d["version"]) for d in report["dashboards"]}
    assert status["minder-fleet"] == ("updated", 2)
    assert {s for uid, s in status.items() if uid != "minder-fleet"} == {("unchanged", 1)}
    assert grafana.dashboards["minder-fleet"]["description"] == "changed by hand"
    update = grafana.calls("POST", "/api/dashboards/db")[-1].body
    assert update["dashboard"]["id"] == ids["minder-fleet"] and update["overwrite"] is True
    assert first["folder"]["created"] is True and report["folder"]["created"] is False


def test_a_dashboard_in_another_folder_is_moved(grafana: FakeGrafana) -> None:
    _push_json(grafana)
    grafana.add_folder("Elsewhere", "elsewhere")
    grafana.dashboard_folders["minder-job"] = "elsewhere"

    report = _push_json(grafana)

    status = {d["uid"]: d["status"] for d in report["dashboards"]}
    assert status["minder-job"] == "updated"
    assert grafana.dashboard_folders["minder-job"] == "minder"


def test_an_existing_folder_is_found_by_title(grafana: FakeGrafana) -> None:
    grafana.add_folder("Minder", "a1b2c3")

    report = _push_json(grafana)

    assert report["folder"] == {"uid": "a1b2c3", "title": "Minder", "created": False}
    assert grafana.calls("POST", "/api/folders") == []
    assert set(grafana.dashboard_folders.values()) == {"a1b2c3"}


def test_another_folder_title(grafana: FakeGrafana) -> None:
    report = _push_json(grafana, "--folder", "GPU fleet / Minder")
    assert report["folder"] == {
        "uid": "gpu-fleet-minder",
        "title": "GPU fleet / Minder",
        "created": True,
    }


def test_table_output_names_each_dashboard_and_the_totals(grafana: FakeGrafana) -> None:
    result = _push(grafana, "--token", grafana.token)
    assert result.exit_code == 0, result.output
    assert "minder-fleet" in result.stdout and "created" in result.stdout
    assert "folder Minder (uid minder) created; 5 created, 0 updated, 0 unchanged" in result.stdout


def test_token_from_the_environment(grafana: FakeGrafana) -> None:
    result = _push(grafana, "--format", "json", env={"GRAFANA_TOKEN": grafana.token})
    assert result.exit_code == 0, result.output
    assert {r.authorization for r in grafana.requests} == {f"Bearer {grafana.token}"}


def test_basic_auth(grafana: FakeGrafana) -> None:
    result = _push(grafana, "--basic-auth", "admin:admin", "--format", "json")
    assert result.exit_code == 0, result.output
    assert all(r.authorization.startswith("Basic ") for r in grafana.requests)


def test_a_wrong_token_exits_2_with_one_line(grafana: FakeGrafana) -> None:
    line = _one_line_error(_push(grafana, "--token", "wrong"))
    assert "401" in line and grafana.url in line and "--token" in line
    assert grafana.dashboards == {} and grafana.folders == {}


def test_no_credentials_exits_2_with_one_line(grafana: FakeGrafana) -> None:
    line = _one_line_error(_push(grafana, env={"GRAFANA_TOKEN": ""}))
    assert "401" in line


def test_a_viewer_token_exits_2_with_one_line(grafana: FakeGrafana) -> None:
    line = _one_line_error(_push(grafana, "--token", grafana.viewer_token))
    assert "403" in line and "Editor" in line
    assert grafana.folders == {}


def test_an_unreachable_grafana_exits_2_with_one_line() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    result = runner.invoke(
        dashboards_app,
        ["push", "--grafana-url", url, "--token", "t", "--dir", str(JSON_DIR), "--timeout", "3"],
    )
    line = _one_line_error(result)
    assert f"cannot reach Grafana at {url}" in line
    assert "refused" in line.lower()


@pytest.mark.parametrize(
    "url", ["ftp://grafana:3000", "grafana:3000", "not a url", "http://grafana:99999", "http://"]
)
def test_a_bad_url_exits_2_with_one_line(url: str) -> None:
    result = runner.invoke(
        dashboards_app, ["push", "--grafana-url", url, "--token", "t", "--dir", str(JSON_DIR)]
    )
    assert "--grafana-url" in _one_line_error(result)


def test_token_and_basic_auth_together_are_refused(grafana: FakeGrafana) -> None:
    line = _one_line_error(_push(grafana, "--token", "t", "--basic-auth", "a:b"))
    assert "not both" in line


def test_a_missing_folder_of_dashboards_exits_2_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(
        dashboards_app,
        ["push", "--grafana-url", "http://127.0.0.1:1", "--dir", str(tmp_path / "nope")],
    )
    assert "no such folder" in _one_line_error(result)


def test_a_file_that_is_not_a_dashboard_exits_2_naming_it(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    result = runner.invoke(dashboards_app, ["list", "--dir", str(tmp_path)])
    assert "broken.json" in _one_line_error(result)


def test_urls_and_folder_uids() -> None:
    target = parse_grafana_url("https://admin:secret@grafana.example:3443/grafana/")
    assert (target.protocol, target.host, target.port, target.path_prefix) == (
        "https",
        "grafana.example",
        3443,
        "grafana/",
    )
    assert (target.url_user, target.url_password) == ("admin", "secret")
    assert target.display == "https://grafana.example:3443/grafana"
    assert parse_grafana_url("http://[::1]:3000").host == "[::1]"
    with pytest.raises(ValueError, match=r"\*\*\*@") as raised:
        parse_grafana_url("http://admin:secret@grafana:99999")
    assert "secret" not in str(raised.value)
    assert folder_uid_for("Minder") == "minder"
    assert len(folder_uid_for("x" * 100)) == 40


def test_push_under_a_path_prefix(grafana: FakeGrafana) -> None:
    """A Grafana served under /grafana/ is reached at /grafana/api/... (the fake at /api/...)."""
    result = runner.invoke(
        dashboards_app,
        ["push", "--grafana-url", grafana.url + "/grafana", "--token", grafana.token],
    )
    assert "404" in _one_line_error(result)
    assert all(r.path.startswith("/grafana/api/") for r in grafana.requests)


# --- the fake itself follows the documented API ------------------------------------------------


def _call(fake: FakeGrafana, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(fake.url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {fake.token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_fake_refuses_a_stale_version_without_overwrite(grafana: FakeGrafana) -> None:
    dashboard = {"id": None, "uid": "x", "title": "X"}
    assert _call(grafana, "POST", "/api/dashboards/db", {"dashboard": dashboard})[0] == 200
    assert _call(grafana, "POST", "/api/dashboards/db", {"dashboard": dashboard}) == (
        412,
        {"message": "The dashboard has been changed by someone else", "status": "version-mismatch"},
    )
    status, saved = _call(
        grafana, "POST", "/api/dashboards/db", {"dashboard": {**dashboard, "version": 1}}
    )
    assert status == 200 and saved["version"] == 2 and saved["status"] == "success"
    status, saved = _call(
        grafana, "POST", "/api/dashboards/db", {"dashboard": dashboard, "overwrite": True}
    )
    assert status == 200 and saved["version"] == 3
    assert _call(grafana, "GET", "/api/dashboards/uid/x")[1]["dashboard"]["version"] == 3


def test_the_fake_answers_404_and_400_as_documented(grafana: FakeGrafana) -> None:
    assert _call(grafana, "GET", "/api/dashboards/uid/nope") == (
        404,
        {"message": "Dashboard not found"},
    )
    assert _call(grafana, "GET", "/api/folders/nope")[0] == 404
    assert _call(grafana, "POST", "/api/dashboards/db", {"dashboard": {"title": ""}})[0] == 400
    assert (
        _call(grafana, "POST", "/api/dashboards/db", {"dashboard": {"id": 99, "title": "t"}})[0]
        == 404
    )
    assert (
        _call(
            grafana, "POST", "/api/dashboards/db", {"dashboard": {"title": "t"}, "folderUid": "f"}
        )[0]
        == 400
    )
    assert (
        _call(grafana, "POST", "/api/dashboards/db", {"dashboard": {"title": "t"}, "bad": 1})[0]
        == 400
    )
    assert _call(grafana, "POST", "/api/folders", {"uid": "a"})[0] == 400
    assert _call(grafana, "POST", "/api/folders", {"title": "A", "uid": "a"})[0] == 200
    assert _call(grafana, "POST", "/api/folders", {"title": "B", "uid": "a"})[0] == 409


# --- list --------------------------------------------------------------------------------------


def test_list_names_the_five_dashboards() -> None:
    result = runner.invoke(dashboards_app, ["list", "--dir", str(JSON_DIR), "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert {d["uid"] for d in listed} == UIDS
    assert all(d["panels"] > 0 and d["title"].startswith("Minder / ") for d in listed)


def test_the_root_command_lists_the_shipped_dashboards_from_any_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without --dir, the dashboards shipped with the package (its data), wherever one runs."""
    from minder.cli import app

    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["dashboards", "list", "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert {d["uid"] for d in listed} == UIDS
    assert {Path(d["file"]).parent for d in listed} == {SHIPPED_DIR}
    assert SHIPPED_DIR.samefile(JSON_DIR)  # in a checkout the package data is the committed JSON
    table = runner.invoke(app, ["dashboards", "list"])
    assert table.exit_code == 0, table.output
    assert "minder-fleet" in table.stdout and "Minder / Fleet" in table.stdout


def test_without_grafana_client_the_error_names_the_extra(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "grafana_client", None)  # import raises ImportError
    line = _one_line_error(_push(grafana, "--token", grafana.token))
    assert "grafana-client is not installed" in line and "pip install 'minder[grafana]'" in line
    assert grafana.requests == []


def test_the_client_pushes_without_the_cli(grafana: FakeGrafana) -> None:
    report = push_to_grafana(grafana.url, token=grafana.token, folder="Ops")
    assert (report.folder_uid, report.folder_created, report.count("created")) == ("ops", True, 5)
    again = push_to_grafana(grafana.url, token=grafana.token, folder="Ops")
    assert again.count("unchanged") == 5
    with pytest.raises(DashboardError, match="401"):
        push_to_grafana(grafana.url, token="wrong")


def test_a_refused_save_names_grafanas_reason(grafana: FakeGrafana) -> None:
    """E.g. Grafana refusing to overwrite a provisioned dashboard answers 400 with a message."""
    original = grafana.save_dashboard
    grafana.save_dashboard = lambda body: (400, {"message": "Cannot save provisioned dashboard"})  # type: ignore[method-assign]
    try:
        line = _one_line_error(_push(grafana, "--token", grafana.token))
    finally:
        grafana.save_dashboard = original  # type: ignore[method-assign]
    assert line.endswith("answered 400: Cannot save provisioned dashboard")
