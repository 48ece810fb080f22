"""The harness's container image (the Dockerfile at the root): built with no network from
the host's own Python and its installed dependencies, and `docker run` of its default
command runs the smoke suite, its scorecard landing in the mounted folder on the host.

The build needs a running Docker engine (the docker tier). Without one it is skipped,
except in CI (the ``CI`` variable set), where `.ci/run` starts the engine.
"""

from __future__ import annotations

import json
import os
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import pytest

from harness.docker.errors import DockerSdkMissing, DockerUnavailable

try:
    from harness.docker.harness_image import (
        NO_WHEELS,
        PROJECT,
        WHEELS,
        BuiltImage,
        ensure_harness_image,
    )
    from harness.docker.image import connect
    from harness.docker.python_base import _RootTar
    from harness.docker.site_image import (
        _canonical,
        _installed_name,
        _script,
        dependency_distributions,
    )
except DockerSdkMissing as missing:
    if os.environ.get("CI"):
        raise
    pytest.skip(str(missing), allow_module_level=True)

if TYPE_CHECKING:
    from docker import DockerClient

ROOT = Path(__file__).resolve().parent.parent


def test_the_dockerfile_installs_dependencies_before_the_code() -> None:
    """Layer order, so that a change to the code reuses the dependency layers; the
    defaults are the users' build (the wheels folder, both stages on BASE); and the
    build context (.dockerignore) is exactly what the image's input hash covers."""
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    steps = [words for words in lines if words and words[0].isupper()]
    stages = [i for i, words in enumerate(steps) if words[0] == "FROM"]
    final = steps[stages[-1] :]
    copies = [words[1:] for words in final if words[0] == "COPY"]
    assert copies[0][0] == "--from=dependencies"  # the installed wheels come first
    code = [i for i, c in enumerate(copies) if c[0] in ("faults/", "harness/")]
    assert code and min(code) > 1
    dependency_stage = steps[stages[0] : stages[-1]]
    assert [w[1:] for w in dependency_stage if w[0] == "COPY"] == [["${WHEELS}/", "/wheels/"]]
    args = dict(w[1].split("=", 1) for w in steps if w[0] == "ARG" and "=" in w[1])
    assert args["WHEELS"] == str(WHEELS) and args["FINAL_BASE"] == "${BASE}"
    assert steps[stages[0]][1:] == ["${BASE}", "AS", "dependencies"]
    assert final[0][1:] == ["${FINAL_BASE}"]
    kept = {
        line[1:]
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert kept - {str(WHEELS), str(NO_WHEELS)} == set(PROJECT) - {".dockerignore"}


def test_the_fast_path_installs_what_users_get_and_no_test_tools() -> None:
    """The test image's dependencies (this environment's installed ones) are the set of
    `tightrope[semantic]`, as the wheels of the users' build: no test tool, not the
    project's own editable install; its scripts run the image's interpreter."""
    names = {_canonical(d.metadata["Name"]) for d in dependency_distributions()}
    assert {"torch", "numpy", "pydantic", "sentence-transformers", "setuptools", "pip"} <= names
    assert not names & {"tightrope", "pytest", "mypy", "ruff", "hypothesis", "docker"}
    script = b"#!/somewhere/.venv/bin/python\nimport sys\n"
    assert _script(script, "/usr/local/bin/python3.11") == (
        b"#!/usr/local/bin/python3.11\nimport sys\n"
    )
    assert _installed_name(PurePosixPath("../../../bin/torchrun"), "python3.11") == (
        "usr/local/bin/torchrun"
    )
    assert _installed_name(PurePosixPath("torch/__init__.py"), "python3.11") == (
        "usr/local/lib/python3.11/site-packages/torch/__init__.py"
    )
    assert _installed_name(PurePosixPath("../../../../etc/x"), "python3.11") is None


def test_the_base_keeps_symlinked_folders_as_links(tmp_path: Path) -> None:
    """A merged /usr (/lib -> usr/lib) must look the same inside, or the loader paths
    written into every binary would not resolve."""
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "libx.so.1").write_bytes(b"\x7fELF")
    (tmp_path / "lib").symlink_to("usr/lib")
    out = tmp_path / "root.tar"
    with tarfile.open(out, "w") as tar:
        _RootTar(tar).host_path(tmp_path / "lib" / "libx.so.1")
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
    prefix = str(tmp_path)[1:]
    link = members[f"{prefix}/lib"]
    assert link.issym() and link.linkname == "usr/lib"
    assert members[f"{prefix}/usr/lib/libx.so.1"].isfile()
    assert f"{prefix}/lib/libx.so.1" not in members


def test_a_file_is_stored_with_its_targets_bytes_and_mode_owned_by_root(tmp_path: Path) -> None:
    """A host file reached through a link goes into the image as its target's bytes and
    permission bits (an interpreter stays executable), owned by root."""
    target = tmp_path / "libx.so.1.2"
    target.write_bytes(os.urandom(70_000))
    target.chmod(0o751)
    (tmp_path / "libx.so.1").symlink_to(target.name)
    out = tmp_path / "root.tar"
    with tarfile.open(out, "w") as tar:
        _RootTar(tar).file(tmp_path / "libx.so.1", "usr/lib/libx.so.1")
    with tarfile.open(out) as tar:
        member = tar.getmember("usr/lib/libx.so.1")
        assert member.isfile() and member.mode == 0o751
        assert (member.uid, member.gid, member.uname, member.gname) == (0, 0, "root", "root")
        assert tar.extractfile(member).read() == target.read_bytes()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def client() -> DockerClient:
    """The local Docker engine; skip (fail in CI) when it cannot be reached."""
    try:
        # A build unpacks torch for minutes without a word: a long read timeout.
        return connect(timeout=3600)
    except DockerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the docker tests: {exc}")
        pytest.skip(str(exc))


#: The test's image, tagged apart from the users' `tightrope:latest` (it is built another way).
TEST_IMAGE = "tightrope-test:latest"


@pytest.fixture(scope="module")
def image(client: DockerClient) -> BuiltImage:
    """The harness image from the project's Dockerfile, built when its inputs changed, else
    the cached one. Its dependencies are this environment's, imported as the final stage's
    base (about a minute), not gathered as wheels and installed by the build (three):
    the same packages and the same Dockerfile steps otherwise (docs/container.md)."""
    return ensure_harness_image(client, tag=TEST_IMAGE, dependencies="environment")


@pytest.mark.docker
@pytest.mark.slow
def test_docker_run_writes_the_smoke_scorecard_to_the_mounted_folder(
    client: DockerClient, image: BuiltImage, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    default = client.images.get(image.tag).attrs["Config"]["Cmd"]
    assert default == ["run", "/opt/tightrope/scenarios/smoke.yaml", "--scorecard", "/work/out"]
    name = f"tightrope-image-test-{uuid.uuid4().hex[:8]}"
    # The default command cut to one scenario; no network at all, as offline as the build
    # (and a host name that resolves without one, as torchrun's rendezvous needs).
    container = client.containers.run(
        image.tag,
        [*default, "-k", "nan-grad"],
        name=name,
        volumes={str(out): {"bind": "/work/out", "mode": "rw"}},
        network_mode="none",
        hostname="localhost",
        detach=True,
    )
    try:
        status = container.wait(timeout=600)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, logs[-3000:]
    scorecard = json.loads((out / "scorecard.json").read_text())
    assert [(s["name"], s["status"]) for s in scorecard["scenarios"]] == [("nan-grad", "passed")]
    for written in ("scorecard.md", "scorecard.html", "junit.xml", "badge.svg"):
        assert (out / written).stat().st_size > 0
