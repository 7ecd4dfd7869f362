"""``/docs`` and ``/redoc`` work without internet access: every asset is served by the app."""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from minder.api import create_app
from minder.storage import create_engine_for, session_factory


class _AssetUrls(HTMLParser):
    """Collects the URLs a browser would fetch: ``<script src>`` and ``<link href>``."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.scripts.append(str(values["src"]))
        elif tag == "link" and values.get("href"):
            self.links.append(str(values["href"]))


def _asset_urls(html: str) -> _AssetUrls:
    parser = _AssetUrls()
    parser.feed(html)
    parser.close()
    return parser


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and url.startswith("/")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """The app on an unmigrated SQLite file: the docs pages need no database."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'docs.db'}")
    try:
        app = create_app(session_factory(engine), registry=CollectorRegistry())
        with TestClient(app) as test_client:
            yield test_client
    finally:
        engine.dispose()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_page_loads_only_local_assets(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "cdn." not in html
    assert "fonts.googleapis" not in html
    assets = _asset_urls(html)
    assert assets.scripts, f"{page} loads no script"
    for url in [*assets.scripts, *assets.links]:
        assert _is_local(url), f"{page} points at {url!r}, which needs the internet"
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.content, url
    for url in assets.scripts:
        content_type = client.get(url).headers["content-type"]
        assert "javascript" in content_type, (url, content_type)


def test_swagger_ui_styles_are_served(client: TestClient) -> None:
    assets = _asset_urls(client.get("/docs").text)
    stylesheets = [url for url in assets.links if url.endswith(".css")]
    assert stylesheets
    for url in stylesheets:
        response = client.get(url)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/css")
        assert len(response.content) > 1000


def test_docs_page_loads_the_apps_openapi_document(client: TestClient) -> None:
    html = client.get("/docs").text
    assert "url: '/openapi.json'" in html
    assert client.get("/openapi.json").json()["info"]["title"] == "Minder"
