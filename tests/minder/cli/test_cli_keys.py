"""``minder keys``: a rotation walked through as an operator would, and its one-line errors."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import yaml
from typer.testing import CliRunner

from minder.cli.app import app
from minder.core.signing import Signer, Verifier, load_cluster_keys, load_node_key

runner = CliRunner()


def minder(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
    return result.exit_code, result.stdout, result.stderr


def test_a_rotation_never_leaves_a_node_unable_to_sign(tmp_path: Path) -> None:
    keys = tmp_path / "cluster.keys"
    assert minder("keys", "init", str(keys), "--kid", "old")[0] == 0
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert (
        minder("keys", "node", str(keys), "-n", "gpu-1", "--out-dir", str(tmp_path / "a"))[0] == 0
    )
    old_signer = Signer(load_node_key(tmp_path / "a" / "gpu-1.key"))

    code, _, stderr = minder("keys", "rotate", str(keys), "--kid", "new")
    assert code == 0 and "new" in stderr
    # the service restarted on the rotated file takes both the old and the new node key
    during = Verifier(load_cluster_keys(keys))
    assert during.verify(old_signer.header(b"p")[1], b"p").kid == "old"
    assert (
        minder("keys", "node", str(keys), "-n", "gpu-1", "--out-dir", str(tmp_path / "b"))[0] == 0
    )
    new_signer = Signer(load_node_key(tmp_path / "b" / "gpu-1.key"))
    assert during.verify(new_signer.header(b"p")[1], b"p").kid == "new"

    code, stdout, _ = minder("keys", "list", str(keys), "--format", "json")
    assert code == 0 and json.loads(stdout) == [
        {"kid": "old", "newest": False},
        {"kid": "new", "newest": True},
    ]
    assert minder("keys", "retire", str(keys), "old")[0] == 0
    assert [k.kid for k in load_cluster_keys(keys)] == ["new"]


def test_node_keys_as_a_kubernetes_secret(tmp_path: Path) -> None:
    keys = tmp_path / "cluster.keys"
    minder("keys", "init", str(keys), "--kid", "k")
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("gpu-1\ngpu-2\n\n")
    code, stdout, _ = minder(
        "keys", "node", str(keys), "--nodes-file", str(nodes), "--kubernetes-secret", "agent-keys"
    )
    assert code == 0
    secret = yaml.safe_load(stdout)
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "agent-keys"
    assert sorted(secret["data"]) == ["gpu-1.key", "gpu-2.key"]
    written = tmp_path / "gpu-2.key"
    written.write_bytes(base64.b64decode(secret["data"]["gpu-2.key"]))
    written.chmod(0o600)
    assert load_node_key(written) == load_cluster_keys(keys)[0].node_key("gpu-2")


def test_mistakes_are_one_line(tmp_path: Path) -> None:
    keys = tmp_path / "cluster.keys"
    minder("keys", "init", str(keys), "--kid", "only")
    cases = [
        (("keys", "init", str(keys)), "exists"),
        (("keys", "retire", str(keys), "only"), "only key"),
        (("keys", "retire", str(keys), "nope"), "not in"),
        (("keys", "node", str(keys), "--out-dir", str(tmp_path)), "no node"),
        (("keys", "node", str(keys), "-n", "x"), "exactly one of"),
        (("keys", "node", str(keys), "-n", "a/b", "--out-dir", str(tmp_path)), "file name"),
        (("keys", "rotate", str(tmp_path / "missing")), "cannot be read"),
        (("keys", "init", str(tmp_path / "k2"), "--kid", "bad id"), "key id"),
    ]
    for args, expected in cases:
        code, _, stderr = minder(*args)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert code != 0, args
        assert len(lines) == 1 and expected in lines[0], (args, stderr)
