"""The base of the harness's image: the host's own Python, imported as an image.

No base image can be pulled (a test machine may have no registry at all), so the base is
the host's interpreter, its standard library (no site-packages, tests or tkinter),
``/bin/sh``, and the system libraries that these and the installed wheels link against,
found by ``ldd``. It is imported again only when those files changed (a hash of them, in a
label). `harness.docker.harness_image` builds on it, and so does
`harness.docker.site_image`.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from harness.docker.errors import DockerError, DockerSdkMissing

try:
    import docker
    import docker.errors
except ImportError as exc:  # only without the `docker` extra
    raise DockerSdkMissing() from exc

PYTHON_IMAGE = "tightrope-python:latest"
LAYOUT_LABEL = "tightrope.layout"
# Parts of the standard library a headless harness never imports: a third of its size.
_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__"}
_DYNLOAD_SKIP = re.compile(r"^(_tkinter|_test|_ctypes_test|_xxtestfuzz|xxlimited)")
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/sbin/nologin\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


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
        with open(source, "rb") as handle:
            # One fstat of what was opened (a link's target): gettarinfo's realpath and user
            # lookups were a third of the site image's tar (44,000 files: 17-20 s of CPU).
            status = os.fstat(handle.fileno())
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = status.st_size, status.st_mode, status.st_mtime
            info.uname = info.gname = "root"
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
    ``ldd`` resolves them; those under ``inside`` (shipped with a wheel) left out. (About
    5 s for an environment's 600 shared objects.)"""
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
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        write_python_root(_RootTar(tar), sources or _BaseSources.here())


#: `_libraries_of` by `_BaseSources.key`: the base image and the site image built on it
#: (one process imports both) write the same root.
_LIBRARIES: dict[str, set[Path]] = {}


def _libraries_of(s: _BaseSources) -> set[Path]:
    """The system libraries the base needs (`linked_libraries`), found once a process for
    the same files."""
    key = s.key()
    if key not in _LIBRARIES:
        dynload = [f for f in _stdlib_files(s.stdlib) if f.parent.name == "lib-dynload"]
        objects = [s.interpreter, s.shell, *dynload, *s.wheel_objects()]
        _LIBRARIES[key] = linked_libraries(objects, inside=s.site)
    return _LIBRARIES[key]


def write_python_root(root: _RootTar, s: _BaseSources) -> None:
    """Add the base image's files (`python_root_tar`'s) to ``root``."""
    libraries = _libraries_of(s)
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


def _label(client: docker.DockerClient, tag: str, label: str) -> str | None:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot inspect the image {tag}: {exc.explanation}") from exc
    value = (image.labels or {}).get(label)
    return str(value) if value is not None else None


def image_settings(layout: str) -> list[str]:
    """The imported image's environment, and ``layout`` as its label (the hash of the files
    it was made from), as ``docker import`` changes."""
    return [
        "ENV PATH=/usr/local/bin:/usr/bin:/bin",
        # The interpreter's libpython moved to /usr/local/lib with it.
        "ENV LD_LIBRARY_PATH=/usr/local/lib",
        "ENV LANG=C.UTF-8",
        f"LABEL {LAYOUT_LABEL}={layout}",
    ]


def ensure_python_image(client: docker.DockerClient, tag: str = PYTHON_IMAGE) -> str:
    """Import the host's Python as the image ``tag`` unless the image there was made from
    the same files; the hash of those files."""
    sources = _BaseSources.here()
    layout = sources.key()
    if _label(client, tag, LAYOUT_LABEL) == layout:
        return layout
    repository, _, version = tag.rpartition(":")
    changes = image_settings(layout)
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
