"""HTTP API (FastAPI): the only package of Minder that imports FastAPI and Starlette."""

from minder.api.app import API_PREFIX, create_app

__all__ = ["API_PREFIX", "create_app"]
