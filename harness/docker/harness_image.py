"""The harness's own container image (the Dockerfile at the project's root), built offline.

No base image can be pulled (a test machine may have no registry at all), so the base is
the host's own Python, imported as an image (`harness.docker.python_base`). The
dependencies come from a wheel directory that ``pip wheel`` gathers from the local package
index under the project's constraints (torch: the pinned CPU build). ``docker build
--network none`` then runs the Dockerfile's layers: the dependencies first, the project's
code last.

Each step is skipped when its inputs did not change: the base by a hash of its tar, the
wheels by a hash of pyproject.toml and constraints.txt, the image by a hash of everything
the build reads (labels on the images, as the node image of `harness.docker.image` does).

    python -m harness.docker.harness_image            # prepare and build; prints the tag
    docker run --network none --hostname localhost -v "$PWD/out:/work/out" tightrope:latest
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.docker.errors import DockerError, DockerSdkMissing
from harness.docker.image import connect
from harness.docker.python_base import (
    PYTHON_IMAGE,
    _label,
    ensure_python_image,
    python_root_tar,
    write_python_root,
)
from harness.docker.site_image import SITE_IMAGE, ensure_site_image

try:
    import docker
    import docker.errors
except ImportError as exc:  # only without the `docker` extra
    raise DockerSdkMissing() from exc

__all__ = [
    "IMAGE",
    "PYTHON_IMAGE",
    "BuiltImage",
    "ensure_harness_image",
    "gather_wheels",
    "python_root_tar",
    "write_python_root",
]

IMAGE = "tightrope:latest"
DEPENDENCIES_IMAGE = "tightrope-dependencies:latest"
#: The first stage of a build from the site image (`harness.docker.site_image`), tagged
#: apart so that neither kind replaces the other's.
SITE_DEPENDENCIES_IMAGE = "tightrope-site-dependencies:latest"
INPUTS_LABEL = "tightrope.inputs"
ROOT = Path(__file__).resolve().parents[2]
#: Where the Dockerfile takes the wheels from (inside the build context, and git-ignored).
WHEELS = Path("build") / "image" / "wheels"
#: An empty wheel folder, for a build whose first stage has its dependencies already.
NO_WHEELS = Path("build") / "image" / "no-wheels"
#: What the image installs besides the project: its dependencies and the embedding model's
#: (the document stages load it), and a setuptools new enough to build the project.
REQUIREMENTS = (".[semantic]", "setuptools>=68")
#: The project files the Dockerfile copies; a change to any rebuilds the image.
PROJECT = (
    *("Dockerfile", ".dockerignore", "pyproject.toml", "README.md"),
    *("faults", "harness", "reference_trainer", "scenarios"),
)


@dataclass(frozen=True, slots=True)
class BuiltImage:
    """The harness image: its tag and id, and whether this call built it (and how long)."""

    tag: str
    id: str
    built: bool
    seconds: float


def _digest_tree(digest: Any, root: Path, names: Iterable[str]) -> None:
    for top in names:
        path = root / top
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                digest.update(str(file.relative_to(root)).encode() + b"\0")
                digest.update(hashlib.sha256(file.read_bytes()).digest())


def gather_wheels(root: Path = ROOT) -> Path:
    """Every dependency of the image as a wheel in ``root/build/image/wheels``, from the
    local package index (gathered again only when pyproject.toml or constraints.txt
    change); the folder."""
    dest = root / WHEELS
    digest = hashlib.sha256(sys.version.encode())
    _digest_tree(digest, root, ("pyproject.toml", "constraints.txt"))
    stamp = dest / ".inputs"
    if stamp.is_file() and stamp.read_text() == digest.hexdigest():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(dest)]
    command += ["-c", "constraints.txt", *REQUIREMENTS]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DockerError(f"pip wheel failed (exit {result.returncode}): {result.stderr[-2000:]}")
    # The project itself is installed from its source, in the Dockerfile's last layers.
    for own in dest.glob("tightrope-*.whl"):
        own.unlink()
    stamp.write_text(digest.hexdigest())
    return dest


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None


def _remove_replaced(client: docker.DockerClient, before: dict[str, str | None]) -> None:
    """Remove the images our tags pointed to before this build (each ~2 GB on disk): by
    id, so nothing of anyone else's is touched; one still in use is left alone."""
    for tag, old in before.items():
        if old is not None and old != _image_id(client, tag):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(old)


def _build(
    client: docker.DockerClient, root: Path, buildargs: dict[str, str], **options: object
) -> str:
    try:
        image, _log = client.images.build(
            path=str(root),
            network_mode="none",  # the proof that nothing is fetched
            buildargs=buildargs,
            rm=True,
            forcerm=True,
            **options,  # type: ignore[arg-type]
        )
    except docker.errors.BuildError as exc:
        lines = [str(step.get("stream") or step.get("error") or "") for step in exc.build_log]
        raise DockerError(f"docker build failed: {exc.msg}\n{''.join(lines)[-3000:]}") from exc
    except docker.errors.APIError as exc:
        raise DockerError(f"docker build failed: {exc.explanation}") from exc
    return str(image.id)


def ensure_harness_image(
    client: docker.DockerClient,
    *,
    root: Path = ROOT,
    tag: str = IMAGE,
    dependencies: str = "wheels",
) -> BuiltImage:
    """Build the Dockerfile as ``tag`` unless an image of the same inputs is there.
    ``dependencies``: "wheels" (gathered from the package index and installed by the
    build, as users build it) or "environment" (this environment's installed ones, given
    to the build as an image: the tests' fast path, `harness.docker.site_image`)."""
    if dependencies not in ("wheels", "environment"):
        raise DockerError(f"dependencies: expected 'wheels' or 'environment', got {dependencies!r}")
    stage = SITE_DEPENDENCIES_IMAGE if dependencies == "environment" else DEPENDENCIES_IMAGE
    tags = (tag, stage, PYTHON_IMAGE, SITE_IMAGE)
    before = {t: _image_id(client, t) for t in tags}
    layout = ensure_python_image(client)
    buildargs = {"BASE": PYTHON_IMAGE}
    digest = hashlib.sha256(f"{layout}:{dependencies}".encode())
    if dependencies == "environment":
        digest.update(ensure_site_image(client).encode())
        # No wheels to install: the final stage starts from the installed ones, and the
        # first stage (which then installs nothing) adds nothing to them.
        (root / NO_WHEELS).mkdir(parents=True, exist_ok=True)
        buildargs |= {"FINAL_BASE": SITE_IMAGE, "WHEELS": NO_WHEELS.as_posix()}
    else:
        for wheel in sorted(gather_wheels(root).glob("*.whl")):
            digest.update(f"{wheel.name}:{wheel.stat().st_size}\0".encode())
    _digest_tree(digest, root, PROJECT)
    inputs = digest.hexdigest()[:16]
    if _label(client, tag, INPUTS_LABEL) == inputs:
        return BuiltImage(tag, str(client.images.get(tag).id), built=False, seconds=0.0)
    started = time.monotonic()
    # The dependency stage is tagged too, so that the one it replaces can be removed by id
    # (an untagged stage would pile up); the second build takes it from the layer cache.
    _build(client, root, buildargs, tag=stage, target="dependencies")
    image = _build(client, root, buildargs, tag=tag, labels={INPUTS_LABEL: inputs})
    _remove_replaced(client, before)
    return BuiltImage(tag, image, built=True, seconds=time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.docker.harness_image``: prepare the inputs and build the image."""
    parser = argparse.ArgumentParser(prog="python -m harness.docker.harness_image")
    parser.add_argument("--tag", default=IMAGE, help=f"the image's tag (default {IMAGE})")
    args = parser.parse_args(argv)
    try:
        # A build with no output for minutes (torch unpacking) must not time the client out.
        client = connect(timeout=3600)
        built = ensure_harness_image(client, tag=args.tag)
    except DockerError as exc:
        print(f"tightrope: {exc}", file=sys.stderr)
        return 1
    how = f"built in {built.seconds:.0f} s" if built.built else "up to date"
    print(f"{built.tag} ({built.id[:19]}): {how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
