"""``minder.stream`` imports each public name from its module on first use: every name listed
resolves to its module's own object, and no other name does."""

from __future__ import annotations

import importlib

import pytest

import minder.stream as stream


def test_every_public_name_is_its_modules_own() -> None:
    assert set(stream.__all__) == set(stream._MODULES)
    for name, module in stream._MODULES.items():
        own = getattr(importlib.import_module(f"minder.stream.{module}"), name)
        assert getattr(stream, name) is own, name
    assert set(stream.__all__) <= set(dir(stream))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'BatchProdcuer'"):
        stream.BatchProdcuer  # type: ignore[attr-defined]  # noqa: B018
