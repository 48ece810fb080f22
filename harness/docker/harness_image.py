"""The harness's own container image (the Dockerfile at the project's root), built offline.

No base image can be pulled (a test machine may have no registry at all), so the base is
the host's own Python, imported as an image: its interpreter, its standard library (no
site-packages, tests or tkinter), ``/bin/sh``, and the system libraries that these and the
installed wheels link against, found by ``ldd``. The dependencies come from a wheel
directory that ``pip wheel`` gathers from the local package index under the project's
constraints (torch: the pinned CPU build). ``docker build --network none`` then runs the
Dockerfile's layers: the dependencies first, the project's code last.

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
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.docker.errors import DockerError, DockerSdkMissing
from harness.docker.image import connect

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
PYTHON_IMAGE = "tightrope-python:latest"
DEPENDENCIES_IMAGE = "tightrope-dependencies:latest"
#: The base with this environment's installed dependencies (`harness.docker.site_image`).
SITE_IMAGE = "tightrope-site:latest"
#: The first stage of a build from it (tagged apart, so neither kind replaces the other's).
SITE_DEPENDENCIES_IMAGE = "tightrope-site-dependencies:latest"
LAYOUT_LABEL = "tightrope.layout"
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
# Parts of the standard library a headless harness never imports: a third of its size.
_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__"}
_DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test|_ctypes_test|_xxtestfuzz|xxlimited)")
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/sbin/nologin\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


@dataclass(frozen=True, slots=True)
class BuiltImage:
    """The harness image: its tag and id, and whether this call built it (and how long)."""

    tag: str
    id: str
    built: bool
    seconds: float


class _RootTar:
    """A root file system being written: host paths added once each, symlinks kept."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.names: set[str] = set()

    def directory(self, name: str, mode: int = 0o755) -> None:
        """A directory (once)."""
        if name and name not in self.names:
            self.names.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            self.tar.addfile(info)

    def _parents(self, name: str) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.directory("/".join(parts[:i]))

    def data(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """A file of the given bytes."""
        self._parents(name)
        self.names.add(name)
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.tar.addfile(info, io.BytesIO(data))

    def link(self, name: str, target: str) -> None:
        """A symbolic link ``name -> target``."""
        if name in self.names:
            return
        self._parents(name)
        self.names.add(name)
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.tar.addfile(info)

    def file(self, source: Path, name: str) -> None:
        """The host file ``source`` (its content, whatever links lead to it) as ``name``."""
        if name in self.names:
            return
        self._parents(name)
        self.names.add(name)
        info = self.tar.gettarinfo(str(source.resolve()), arcname=name)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        with open(source, "rb") as handle:
            self.tar.addfile(info, handle)

    def host_path(self, path: Path) -> None:
        """A host path at the same place, every symlink on the way kept as a symlink
        (so a merged /usr, /lib -> usr/lib, looks the same inside)."""
        current = Path("/")
        for part in path.parts[1:]:
            current = current / part
            name = str(current)[1:]
            if current.is_symlink():
                target = os.readlink(current)
                self.link(name, target)
                self.host_path(Path(os.path.normpath(current.parent / target)))
                current = Path(os.path.realpath(current))
            elif current.is_dir():
                self.directory(name)
            else:
                self.file(current, name)


def _shared_objects(folder: Path) -> Iterator[Path]:
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if ".so" in name and not name.endswith(".py"):
                yield Path(dirpath, name)


def linked_libraries(files: Iterable[Path], *, inside: Iterable[Path] = ()) -> set[Path]:
    """The system libraries (and the dynamic loader) that ``files`` link against, as
    ``ldd`` resolves them; those under ``inside`` (shipped with a wheel) left out."""
    own = [p.resolve() for p in inside]
    found: set[Path] = set()
    batch = [str(f) for f in files]
    for start in range(0, len(batch), 200):
        result = subprocess.run(
            ["ldd", *batch[start : start + 200]],
            capture_output=True,
            text=True,
            check=False,
        )
        for line in result.stdout.splitlines():
            match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if match:
                path = Path(match.group(1))
                if path.exists() and not any(path.resolve().is_relative_to(o) for o in own):
                    found.add(path)
    return found


def _stdlib_files(stdlib: Path) -> Iterator[Path]:
    for dirpath, dirs, files in os.walk(stdlib):
        here = Path(dirpath)
        dirs[:] = sorted(d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-"))
        for name in sorted(files):
            if here.name == "lib-dynload" and _DYNLOAD_SKIP.match(name):
                continue
            if not name.endswith(".pyc"):
                yield here / name


@dataclass(frozen=True, slots=True)
class _BaseSources:
    """What the base image is made of, on the host."""

    version: str  # python3.11
    prefix: Path
    interpreter: Path
    stdlib: Path
    site: list[Path]
    shell: Path

    @classmethod
    def here(cls) -> _BaseSources:
        """This interpreter's."""
        executable = getattr(sys, "_base_executable", sys.executable)  # not a venv's link
        paths = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        return cls(
            version=f"python{sys.version_info.major}.{sys.version_info.minor}",
            prefix=Path(sys.base_prefix).resolve(),
            interpreter=Path(os.path.realpath(executable)),
            stdlib=Path(sysconfig.get_path("stdlib")),
            site=sorted(Path(p) for p in paths if Path(p).is_dir()),
            shell=Path("/bin/sh"),
        )

    def wheel_objects(self) -> list[Path]:
        """The installed wheels' shared objects (the image installs the same wheels)."""
        return sorted(so for folder in self.site for so in _shared_objects(folder))

    def key(self) -> str:
        """A hash of the interpreter's files (path, size, time), of the system library
        folders' times (an installed or upgraded package changes them), and of the wheels'
        shared objects by name and size: the same wheels in a fresh virtual environment
        give the same key, so a fresh clone reuses the base and every layer built on it.
        Cheap: no ldd, no file read."""
        digest = hashlib.sha256(sys.version.encode())
        files = [self.interpreter, self.shell, *_stdlib_files(self.stdlib)]
        folders = [Path(p) for p in ("/lib", "/lib64", "/usr/lib", "/usr/lib64")]
        folders += sorted(Path("/usr/lib").glob("*-linux-gnu"))
        for path in [*files, *folders]:
            if path.exists():
                info = path.stat()
                digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}\0".encode())
        for folder in self.site:
            for so in sorted(_shared_objects(folder)):
                digest.update(f"{so.relative_to(folder)}:{so.stat().st_size}\0".encode())
        return digest.hexdigest()[:16]


def python_root_tar(out: IO[bytes], sources: _BaseSources | None = None) -> None:
    """Write the base image's root file system: this interpreter at /usr/local, its
    standard library, /bin/sh, and the system libraries all of it and the installed
    wheels load."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        write_python_root(_RootTar(tar), sources or _BaseSources.here())


def write_python_root(root: _RootTar, s: _BaseSources) -> None:
    """Add the base image's files (`python_root_tar`'s) to ``root``."""
    dynload = [f for f in _stdlib_files(s.stdlib) if f.parent.name == "lib-dynload"]
    libraries = linked_libraries(
        [s.interpreter, s.shell, *dynload, *s.wheel_objects()], inside=s.site
    )
    # libpython of a shared build moves with the interpreter, to /usr/local/lib.
    libpython = {p for p in libraries if p.resolve().is_relative_to(s.prefix)}
    root.directory("tmp", 0o1777)
    root.directory("root", 0o700)
    root.data("etc/passwd", _PASSWD)
    root.data("etc/group", _GROUP)
    root.file(s.interpreter, f"usr/local/bin/{s.version}")
    root.link("usr/local/bin/python3", s.version)
    root.link("usr/local/bin/python", s.version)
    for lib in sorted(libpython):
        root.file(lib, f"usr/local/lib/{lib.name}")
    for file in _stdlib_files(s.stdlib):
        root.file(file, f"usr/local/lib/{s.version}/{file.relative_to(s.stdlib)}")
    root.directory(f"usr/local/lib/{s.version}/site-packages")
    root.host_path(s.shell)
    for lib in sorted(libraries - libpython):
        root.host_path(lib)


def _digest_tree(digest: Any, root: Path, names: Iterable[str]) -> None:
    for top in names:
        path = root / top
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            if file.is_file() and "__pycache__" not in file.parts and file.suffix != ".pyc":
                digest.update(str(file.relative_to(root)).encode() + b"\0")
                digest.update(hashlib.sha256(file.read_bytes()).digest())


def _label(client: docker.DockerClient, tag: str, label: str) -> str | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot inspect the image {tag}: {exc.explanation}") from exc
    value = (image.labels or {}).get(label)
    return str(value) if value is not None else None


def ensure_python_image(client: docker.DockerClient, tag: str = PYTHON_IMAGE) -> str:
    """Import the host's Python as the image ``tag`` unless the image there was made from
    the same files; the hash of those files."""
    sources = _BaseSources.here()
    layout = sources.key()
    if _label(client, tag, LAYOUT_LABEL) == layout:
        return layout
    repository, _, version = tag.rpartition(":")
    changes = [
        "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        # The interpreter's libpython moved to /usr/local/lib with it.
        "ENV LD_LIBRARY_PATH=/usr/local/lib",
        "ENV LANG=C.UTF-8",
        f"LABEL {LAYOUT_LABEL}={layout}",
    ]
    with tempfile.TemporaryFile() as handle:
        python_root_tar(handle, sources)
        handle.seek(0)
        try:
            client.api.import_image_from_data(
                handle.read(), repository=repository, tag=version, changes=changes
            )
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot import the base image {tag}: {exc.explanation}") from exc
    return layout


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
        from harness.docker.site_image import ensure_site_image  # it builds on this module

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
