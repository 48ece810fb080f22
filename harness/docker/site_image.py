"""The harness image's dependencies from this environment, imported as an image (the
tests' fast path of `harness.docker.harness_image`).

The Dockerfile's first stage installs every dependency from a folder of wheels: minutes of
gathering and unpacking (torch most of it). The packages are already installed here, in
the environment that runs the build, from the same pinned constraints; so a test imports
them instead: the base image's files (the host's Python, `write_python_root`) and, under
``/usr/local``, every file of the distributions that ``tightrope[semantic]`` and the
build's setuptools and pip need, as their RECORD lists them (console scripts pointed at the
image's interpreter). The Dockerfile's first stage starts from that image with no wheels
to install (``--build-arg DEPENDENCIES_BASE=... WHEELS=build/image/no-wheels``); the rest
of the build is the one users run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import docker
import docker.errors

from harness.docker.errors import DockerError
from harness.docker.python_base import (
    LAYOUT_LABEL,
    _BaseSources,
    _label,
    _RootTar,
    image_settings,
    write_python_root,
)

__all__ = ["REQUIREMENTS", "dependency_distributions", "ensure_site_image", "site_root_tar"]

#: What the image needs installed besides the project (`harness_image.REQUIREMENTS`'s
#: set, by installed name, and pip, which the wheels' build gets from ensurepip); the
#: project itself is installed from source by the build.
REQUIREMENTS = ("tightrope[semantic]", "setuptools", "pip")
#: The base with this environment's installed dependencies.
SITE_IMAGE = "tightrope-site:latest"
OWN = "tightrope"


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def dependency_distributions(
    requirements: tuple[str, ...] = REQUIREMENTS,
) -> list[metadata.Distribution]:
    """The installed distributions that ``requirements`` need, transitively (extras and
    environment markers evaluated here), the project itself left out."""
    # Only the fast path needs it, and pip and pytest bring it wherever that runs.
    from packaging.requirements import Requirement

    todo = [Requirement(r) for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    found: dict[str, metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        key = (_canonical(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError as exc:
            raise DockerError(f"{req.name} (needed by the image) is not installed") from exc
        if key[0] != OWN:
            found[key[0]] = dist
        extras = sorted(req.extras) or [""]
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    return [found[name] for name in sorted(found)]


def _record_key(dists: list[metadata.Distribution]) -> str:
    """A hash of each distribution's name, version and RECORD (every file's hash), its
    compiled files and scripts left out: those hold their sources' install times and the
    environment's path, so a fresh virtual environment of the same wheels, anywhere, gives
    the same key and reuses the image (the scripts come from entry_points.txt, kept)."""
    digest = hashlib.sha256()
    for dist in dists:
        lines = (dist.read_text("RECORD") or "").splitlines()
        record = "\n".join(
            line for line in lines if "__pycache__" not in line and not line.startswith("../")
        )
        digest.update(f"{dist.metadata['Name']}=={dist.version}\0{record}\0".encode())
    return digest.hexdigest()


def _installed_name(relative: PurePosixPath, version: str) -> str | None:
    """Where a RECORD path (relative to site-packages) goes in the image; None outside
    the prefix."""
    parts = relative.parts
    if parts[:3] == ("..", "..", ".."):  # the prefix: scripts, data files
        rest = parts[3:]
        return "/".join(("usr", "local", *rest)) if rest and ".." not in rest else None
    if ".." in parts:
        return None
    return "/".join(("usr", "local", "lib", version, "site-packages", *parts))


def _script(data: bytes, interpreter: str) -> bytes:
    """A console script's first line pointed at the image's interpreter."""
    first, newline, rest = data.partition(b"\n")
    if first.startswith(b"#!") and b"python" in first:
        return b"#!" + interpreter.encode() + newline + rest
    return data


def site_root_tar(path: Path, dists: list[metadata.Distribution], sources: _BaseSources) -> None:
    """Write the base image's root file system with ``dists`` installed in it."""
    interpreter = f"/usr/local/bin/{sources.version}"
    with tarfile.open(path, mode="w", format=tarfile.GNU_FORMAT) as tar:
        root = _RootTar(tar)
        write_python_root(root, sources)
        for dist in dists:
            for entry in dist.files or []:
                name = _installed_name(PurePosixPath(str(entry)), sources.version)
                source = Path(str(dist.locate_file(entry)))
                if name is None or not source.is_file():
                    continue  # outside the prefix, or a RECORD line for a removed .pyc
                if name.startswith("usr/local/bin/"):
                    root.data(name, _script(source.read_bytes(), interpreter), 0o755)
                else:
                    root.file(source, name)


def ensure_site_image(client: docker.DockerClient, tag: str = SITE_IMAGE) -> str:
    """Import the base with this environment's dependencies as ``tag`` unless the image
    there was made from the same files; the hash of those files."""
    sources = _BaseSources.here()
    dists = dependency_distributions()
    key = hashlib.sha256(f"{sources.key()}:{_record_key(dists)}".encode()).hexdigest()[:16]
    if _label(client, tag, LAYOUT_LABEL) == key:
        return key
    repository, _, version = tag.rpartition(":")
    changes = image_settings(key)
    with tempfile.TemporaryDirectory(prefix="tightrope-site-") as folder:
        tar_path = Path(folder) / "root.tar"
        site_root_tar(tar_path, dists, sources)
        try:
            # From the file, streamed: the tar is as large as the packages (GBs).
            client.api.import_image(
                src=str(tar_path), repository=repository, tag=version, changes=changes
            )
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot import the image {tag}: {exc.explanation}") from exc
    return key
