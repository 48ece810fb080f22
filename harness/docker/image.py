"""The Docker engine, the node image, and what a node sees of the host: files, address.

No image is pulled (a test machine may have no registry at all): the node image is a
near-empty root file system imported from a tar built here, a few kilobytes. Everything
a trainer needs comes from the host through read-only bind mounts at the same paths:
the Python installation, the virtual environment, the system libraries the interpreter
and torch link against, and the project; only the run directory is writable. A node
therefore runs exactly the code and packages the harness itself runs.

An engine that cannot be reached is a `DockerUnavailable` naming its address, never a
raw traceback from the SDK.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import os
import sys
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.docker.errors import DockerError, DockerSdkMissing, DockerUnavailable

try:
    import docker
    import docker.errors
    from docker.types import Mount
except ImportError as exc:  # only without the `docker` extra
    raise DockerSdkMissing() from exc

__all__ = [
    "IMAGE",
    "NodeMount",
    "connect",
    "ensure_image",
    "error_reason",
    "image_tar",
    "node_address",
    "node_mounts",
    "torchrun_node_argv",
]

DEFAULT_URL = "unix:///var/run/docker.sock"
IMAGE = "tightrope-node:latest"
LAYOUT_LABEL = "tightrope.layout"
# What the interpreter and torch's shared libraries load from; a symlinked one (a merged
# /usr) is mounted from its target at its own path, so ELF interpreter paths still work.
SYSTEM_PATHS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")
_PASSWD = b"root:x:0:0:root:/tmp:/sbin/nologin\nnobody:x:65534:65534:nobody:/tmp:/sbin/nologin\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


@dataclass(frozen=True, slots=True)
class NodeMount:
    """One bind mount of a host path into a node container."""

    source: Path
    target: Path
    read_only: bool = True

    def to_docker(self) -> Mount:
        """The SDK's form of this mount."""
        return Mount(str(self.target), str(self.source), type="bind", read_only=self.read_only)


def error_reason(exc: BaseException) -> str:
    """The innermost cause of a connection failure, which is the one a user can act on."""
    inner = exc
    while (deeper := inner.__cause__ or inner.__context__) is not None:
        inner = deeper
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(inner) or type(inner).__name__


def connect(base_url: str | None = None, *, timeout: float = 30.0) -> docker.DockerClient:
    """A client of the Docker engine at ``base_url`` (default: $DOCKER_HOST or the socket)."""
    url = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_URL
    try:
        if base_url is None:
            client = docker.from_env(version="auto", timeout=int(timeout))
        else:
            client = docker.DockerClient(base_url=base_url, version="auto", timeout=int(timeout))
        client.ping()
    except (docker.errors.DockerException, OSError) as exc:
        raise DockerUnavailable(url, error_reason(exc)) from exc
    return client


def image_tar() -> bytes:
    """The node image's root file system: a writable /tmp, /etc/passwd and /etc/group."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, mode in (("etc", 0o755), ("tmp", 0o1777)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, data in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def ensure_image(client: docker.DockerClient, tag: str = IMAGE) -> str:
    """Import the node image under ``tag`` unless it is there already; its image id."""
    data = image_tar()
    layout = hashlib.sha256(data).hexdigest()[:16]
    try:
        image = client.images.get(tag)
        # A tag left by an older layout of this module is rebuilt, not trusted.
        if (image.labels or {}).get(LAYOUT_LABEL) == layout:
            return str(image.id)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot inspect the node image {tag}: {exc.explanation}") from exc
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:
        repository, version = tag, "latest"
    try:
        client.api.import_image_from_data(
            data, repository=repository, tag=version, changes=[f"LABEL {LAYOUT_LABEL}={layout}"]
        )
        return str(client.images.get(tag).id)
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot import the node image {tag}: {exc.explanation}") from exc


def _python_paths() -> list[Path]:
    """The interpreter's installation and the virtual environment it runs in, if any."""
    paths = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()]
    # A venv's python is a symlink; its target may live outside sys.base_prefix.
    real = Path(os.path.realpath(sys.executable))
    if not any(real.is_relative_to(p) for p in paths):
        paths.append(real.parent.parent)
    return paths


def node_mounts(
    workdir: Path, run_dir: Path, extra: Iterable[Path] = (), *, harness_root: Path | None = None
) -> list[NodeMount]:
    """The bind mounts of a node: host libraries, Python, project (read-only), run dir."""
    harness_root = harness_root or Path(__file__).resolve().parents[2]  # the project
    mounts: list[NodeMount] = []
    for system in SYSTEM_PATHS:
        path = Path(system)
        if path.exists():
            mounts.append(NodeMount(path.resolve(), path))
    for path in [*_python_paths(), harness_root, workdir.resolve(), *extra]:
        path = path.resolve()
        if not path.exists():
            raise DockerError(f"cannot mount {path} into a node: it does not exist")
        mounts.append(NodeMount(path, path))
    mounts = _outermost(mounts)
    mounts.append(NodeMount(run_dir.resolve(), run_dir.absolute(), read_only=False))
    return mounts


def _outermost(mounts: list[NodeMount]) -> list[NodeMount]:
    """Drop a read-only same-path mount that an outer one of the list already covers."""
    identity = [m.target for m in mounts if m.source == m.target]
    kept: list[NodeMount] = []
    for mount in mounts:
        covered = mount.source == mount.target and any(
            outer != mount.target and mount.target.is_relative_to(outer) for outer in identity
        )
        if not covered and mount not in kept:
            kept.append(mount)
    return kept


def node_address(node: int) -> str:
    """The loopback address node ``node`` presents to torchrun: 127.0.0.<node + 1>."""
    return str(ipaddress.IPv4Address("127.0.0.1") + node)


def torchrun_node_argv(
    nnodes: int | str, nproc_per_node: int, endpoint: str, rdzv_id: str
) -> list[str]:
    """The torchrun head of a node's command (c10d rendezvous at ``endpoint``); ``nnodes``
    may be a range, ``MIN:MAX``."""
    options = {
        "--nnodes": nnodes,
        "--nproc-per-node": nproc_per_node,
        "--rdzv-backend": "c10d",
        "--rdzv-endpoint": endpoint,
        "--rdzv-id": rdzv_id,
    }
    flat = [str(part) for pair in options.items() for part in pair]
    return [sys.executable, "-m", "torch.distributed.run", *flat]
