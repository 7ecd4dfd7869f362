"""``minder keys``: the cluster keys the service verifies batches with, and the node keys the
agents sign with (docs/security.md).

Rotation without a gap: ``rotate`` adds a key (the service accepts every key of its file, so
restart it), ``node`` hands out node keys made from the new key, and ``retire``
removes the old key once every agent signs with the new one
(``minder_batches_unauthenticated_total{reason="unknown_key"}`` stays at 0 after the retire).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.common import OutputFormat, err, fail, out, print_json
from minder.core.errors import ValidationError

keys_app = typer.Typer(
    name="keys",
    help="Signing keys of the node agents: create, rotate, retire, hand out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SECRET_MAX_BYTES = 1 << 20
"""The most data one Kubernetes Secret holds."""

KeysFile = Annotated[Path, typer.Argument(help="the cluster key file (the service's)")]
KidOption = Annotated[
    str | None, typer.Option("--kid", help="key id (default: the UTC time, k20261128T164200Z)")
]


@keys_app.command("init")
def init_command(
    path: KeysFile,
    kid: KidOption = None,
    force: Annotated[bool, typer.Option(help="replace an existing file")] = False,
) -> None:
    """Create a cluster key file with one new key (mode 0600)."""
    from minder.core.signing import init_cluster_keys  # noqa: PLC0415

    try:
        key = init_cluster_keys(path, kid, force=force)
    except ValidationError as exc:
        raise fail(exc) from None
    err.print(f"created {escape(str(path))} with key {key.kid}")


@keys_app.command("rotate")
def rotate_command(path: KeysFile, kid: KidOption = None) -> None:
    """Add a new key; node keys are made from it from now on, the older ones stay accepted."""
    from minder.core.signing import rotate_cluster_keys  # noqa: PLC0415

    try:
        key = rotate_cluster_keys(path, kid)
    except ValidationError as exc:
        raise fail(exc) from None
    err.print(
        f"added key {key.kid} to {escape(str(path))}: restart the service, hand out node keys "
        f"(minder keys node), then retire the old key"
    )


@keys_app.command("retire")
def retire_command(
    path: KeysFile, kid: Annotated[str, typer.Argument(help="the key id to remove")]
) -> None:
    """Remove a key: batches signed with it are refused once the service restarts."""
    from minder.core.signing import retire_cluster_key  # noqa: PLC0415

    try:
        left = retire_cluster_key(path, kid)
    except ValidationError as exc:
        raise fail(exc) from None
    err.print(f"retired {escape(kid)}; {escape(str(path))} holds {', '.join(k.kid for k in left)}")


@keys_app.command("list")
def list_command(
    path: KeysFile,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table or json")
    ] = OutputFormat.table,
) -> None:
    """The key ids of a cluster key file (never the secrets); the last one signs new node keys."""
    from minder.core.signing import load_cluster_keys  # noqa: PLC0415

    try:
        keys = load_cluster_keys(path)
    except ValidationError as exc:
        raise fail(exc) from None
    rows = [{"kid": key.kid, "newest": i == len(keys) - 1} for i, key in enumerate(keys)]
    if output_format is OutputFormat.json:
        print_json(rows)
        return
    table = Table("key id", "newest")
    for row in rows:
        table.add_row(str(row["kid"]), "yes" if row["newest"] else "")
    out.print(table)


@keys_app.command("node")
def node_command(
    path: KeysFile,
    node: Annotated[
        list[str] | None, typer.Option("--node", "-n", help="a node name (repeatable)")
    ] = None,
    nodes_file: Annotated[
        Path | None, typer.Option(help="a file of node names, one per line")
    ] = None,
    kid: Annotated[
        str | None, typer.Option("--kid", help="the cluster key to derive from (default: newest)")
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(help="write <node>.key files here (mode 0600), for systemd LoadCredential="),
    ] = None,
    kubernetes_secret: Annotated[
        str | None,
        typer.Option(
            help="print a Kubernetes Secret of this name holding <node>.key for every node "
            "(the agent DaemonSet mounts it)"
        ),
    ] = None,
    namespace: Annotated[str, typer.Option(help="the Secret's namespace")] = "minder-agent",
) -> None:
    """Make node keys from the cluster key file: key files, or a Kubernetes Secret."""
    import yaml  # noqa: PLC0415

    from minder.core.signing import (  # noqa: PLC0415
        format_node_key,
        load_cluster_keys,
        node_key_file_name,
        pick_cluster_key,
        write_node_keys,
    )

    names = list(node or [])
    try:
        if nodes_file is not None:
            text = nodes_file.read_text(encoding="utf-8")
            names += [line.strip() for line in text.splitlines() if line.strip()]
        if not names:
            raise ValidationError("no node: expected --node NAME or --nodes-file FILE")
        if (out_dir is None) == (kubernetes_secret is None):
            raise ValidationError("expected exactly one of --out-dir DIR and --kubernetes-secret")
        key = pick_cluster_key(load_cluster_keys(path), kid)
        if out_dir is not None:
            written = write_node_keys(key, names, out_dir)
            err.print(f"wrote {len(written)} node keys (key {key.kid}) to {escape(str(out_dir))}")
            return
        data = {
            node_key_file_name(name): base64.b64encode(
                format_node_key(key.node_key(name), comment=False).encode()
            ).decode()
            for name in names
        }
        size = sum(len(name) + len(value) for name, value in data.items())
        if size > SECRET_MAX_BYTES:
            raise ValidationError(
                f"{len(names)} node keys make a Secret of {size} bytes: Kubernetes takes at most "
                f"{SECRET_MAX_BYTES}; expected one Secret per node pool (--nodes-file of a pool)"
            )
    except (ValidationError, OSError) as exc:
        raise fail(exc) from None
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": kubernetes_secret,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "minder-agent", "minder.io/key-id": key.kid},
        },
        "type": "Opaque",
        "data": data,
    }
    typer.echo(yaml.safe_dump(secret, sort_keys=False, width=1 << 20), nl=False)
