"""Turn detector output (numpy values, tuples, NaN) into JSON both databases and the API accept."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from minder.core.errors import ValidationError


def json_safe(value: Any, path: str = "$") -> Any:
    """A copy of ``value`` made of dicts, lists, str, int, float, bool and None only.

    NaN and infinities become ``None`` (PostgreSQL ``jsonb`` and strict JSON refuse them; in an
    evidence window they mean "no sample", which ``null`` says too). Objects with ``tolist()``
    (numpy arrays and scalars) are converted; tuples and sets become lists.

    Raises
    ------
    ValidationError
        For a value of any other type, naming where it sits (``$.peers[3]``) and its type.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(
                    f"JSON object key at {path} is {key!r} ({type(key).__name__}): expected str"
                )
            out[key] = json_safe(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [json_safe(item, f"{path}[{i}]") for i, item in enumerate(items)]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_safe(tolist(), path)
    raise ValidationError(
        f"value at {path} has type {type(value).__name__}: expected JSON data (dict, list, str, "
        "number, bool, None, or a numpy array/scalar)"
    )
