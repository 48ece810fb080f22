"""The damage the checkpoint fuzzer does to a copy of a run: one function per kind.

Each mutation draws everything it needs from the case's `random.Random`, acts on the copy
and returns one line saying what it did (None when the run holds nothing it can act on,
e.g. no delta checkpoint is left). Mutations only ever write inside the copy and the
case's ``outside`` folder: a file reached through a symlink is never written, so the
pristine runs the fuzzer copies from stay intact (the fuzzer checks that at the end).
Which checkpoints are still valid afterwards is not tracked here: the oracle compares
the copy with the pristine run, byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.run_layout import RunLayout
from reference_trainer.checkpoints.files import LATEST, checkpoint_name
from reference_trainer.checkpoints.manifest import MANIFEST

PAGE = 4096
#: Size of the "very large" ``latest``: sparse, so it costs no disk, only a reader's time.
HUGE_LATEST = 64 << 20
JUNK_STEP = 99
LATEST_FORMS = (
    "empty", "garbage", "binary", "huge", "older", "missing", "directory", "symlink_to_dir",
    "symlink_outside", "dangling", "fifo", "deleted",
)  # fmt: skip
_STEP = re.compile(r"step-(\d{8})")


@dataclass(slots=True)
class Target:
    """A case's copy of the run under damage, and what its mutations may reach."""

    rng: random.Random
    run: Path
    """The copy being damaged."""
    outside: Path
    """A folder beside the run: where links that leave the run point."""
    other: Path
    """The other run's pristine folder: read from, never written."""

    @property
    def root(self) -> Path:
        """The copy's checkpoints folder."""
        return RunLayout(self.run).checkpoints

    def checkpoints(self) -> list[str]:
        """Names of the real (not symlinked) step directories present now, oldest first."""
        return sorted(n for n in _names(self.root) if _is_real_dir(self.root / n))

    def unused_higher(self) -> str:
        """A step name above every step-N entry present (of any type)."""
        top = max(
            (int(m.group(1)) for n in _names(self.root) if (m := _STEP.fullmatch(n))), default=0
        )
        return checkpoint_name(top + self.rng.randint(1, 6))

    def unused_lower(self) -> str | None:
        """An unused step name below the newest checkpoint; None when there is none."""
        taken = {int(m.group(1)) for n in _names(self.root) if (m := _STEP.fullmatch(n))}
        free = [s for s in range(max(taken, default=0)) if s not in taken]
        return checkpoint_name(self.rng.choice(free)) if free else None


Mutation = Callable[[Target], "str | None"]


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_real_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _random_file(t: Target, *, non_empty: bool = True) -> Path | None:
    """A regular file of a random checkpoint (state, delta, RNG or manifest)."""
    found = [
        t.root / d / f
        for d in t.checkpoints()
        for f in _names(t.root / d)
        if _is_real_file(t.root / d / f) and (not non_empty or (t.root / d / f).stat().st_size)
    ]
    return t.rng.choice(found) if found else None


def _rel(t: Target, path: Path) -> str:
    return str(path.relative_to(t.root))


# -- bytes of one file ---------------------------------------------------------------------


def bit_flip(t: Target) -> str | None:
    """Flip one bit of one file."""
    path = _random_file(t)
    if path is None:
        return None
    data = bytearray(path.read_bytes())
    bit = t.rng.randrange(len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(data)
    return f"bit_flip {_rel(t, path)} bit {bit}"


def truncate(t: Target) -> str | None:
    """Cut one file short."""
    path = _random_file(t)
    if path is None:
        return None
    size = path.stat().st_size
    length = t.rng.randrange(size)
    os.truncate(path, length)
    return f"truncate {_rel(t, path)} to {length} of {size} bytes"


def zero_page(t: Target) -> str | None:
    """Overwrite one 4 KiB page of a file with zeros (a lost page of a disk)."""
    path = _random_file(t)
    if path is None:
        return None
    size = path.stat().st_size
    offset = t.rng.randrange(-(-size // PAGE)) * PAGE
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(min(PAGE, size - offset)))
    return f"zero_page {_rel(t, path)} at {offset}"


def delete_file(t: Target) -> str | None:
    """Delete one file of a checkpoint."""
    path = _random_file(t, non_empty=False)
    if path is None:
        return None
    path.unlink()
    return f"delete_file {_rel(t, path)}"


# -- whole step directories ----------------------------------------------------------------


def delete_dir(t: Target) -> str | None:
    """Delete one checkpoint directory."""
    names = t.checkpoints()
    if not names:
        return None
    name = t.rng.choice(names)
    shutil.rmtree(t.root / name)
    return f"delete_dir {name}"


def rename_dir(t: Target) -> str | None:
    """Give a checkpoint directory an unused name, higher or lower than its own."""
    names = t.checkpoints()
    if not names:
        return None
    name = t.rng.choice(names)
    lower = t.unused_lower() if t.rng.random() < 0.5 else None
    dest = lower or t.unused_higher()
    (t.root / name).rename(t.root / dest)
    return f"rename_dir {name} -> {dest}"


def swap_dirs(t: Target) -> str | None:
    """Swap the names of two checkpoint directories."""
    names = t.checkpoints()
    if len(names) < 2:
        return None
    a, b = t.rng.sample(names, 2)
    tmp = t.root / ".fuzz-swap"
    (t.root / a).rename(tmp)
    (t.root / b).rename(t.root / a)
    tmp.rename(t.root / b)
    return f"swap_dirs {a} <-> {b}"


def copy_dir(t: Target) -> str | None:
    """Copy a checkpoint directory to an unused higher name."""
    names = t.checkpoints()
    if not names:
        return None
    name, dest = t.rng.choice(names), t.unused_higher()
    shutil.copytree(t.root / name, t.root / dest, symlinks=True)
    return f"copy_dir {name} -> {dest}"


def foreign_dir(t: Target) -> str | None:
    """Copy a checkpoint of the other run in, at an unused higher name or over one of ours."""
    theirs = sorted(n for n in _names(RunLayout(t.other).checkpoints) if _STEP.fullmatch(n))
    ours = t.checkpoints()
    name = t.rng.choice(theirs)
    if ours and t.rng.random() < 0.5:
        dest = name if name in ours else t.rng.choice(ours)
        shutil.rmtree(t.root / dest)
        how = "over"
    else:
        dest, how = t.unused_higher(), "to"
    shutil.copytree(RunLayout(t.other).checkpoints / name, t.root / dest, symlinks=True)
    return f"foreign_dir other run's {name} {how} {dest}"


def symlink(t: Target) -> str | None:
    """Make an unused higher name a symlink to a checkpoint in the run or outside it, or
    replace one file of a checkpoint by a symlink to a copy of it outside the run."""
    ours = t.checkpoints()
    variant = t.rng.choice(["inside", "outside", "file"] if ours else ["outside"])
    if variant == "file":
        path = _random_file(t, non_empty=False)
        if path is None:
            return None
        copy = t.outside / f"{path.parent.name}-{path.name}"
        shutil.copyfile(path, copy)
        path.unlink()
        os.symlink(copy, path)
        return f"symlink {_rel(t, path)} -> an identical copy outside the run"
    dest = t.unused_higher()
    if variant == "inside":
        name = t.rng.choice(ours)
        os.symlink(name, t.root / dest)  # relative: a sibling in the same folder
        return f"symlink {dest} -> {name} (inside the run)"
    name = t.rng.choice(
        sorted(n for n in _names(RunLayout(t.other).checkpoints) if _STEP.fullmatch(n))
    )
    copy = t.outside / name
    if not copy.exists():
        shutil.copytree(RunLayout(t.other).checkpoints / name, copy, symlinks=True)
    os.symlink(copy, t.root / dest)
    return f"symlink {dest} -> other run's {name} (outside the run)"


# -- manifests -----------------------------------------------------------------------------


def _manifest(t: Target, name: str) -> dict[str, Any] | None:
    path = t.root / name / MANIFEST
    if not _is_real_file(path):
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(t: Target, name: str, manifest: dict[str, Any]) -> None:
    (t.root / name / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def delta_parent(t: Target) -> str | None:
    """Rewrite a delta's manifest (valid JSON) so that its parent is itself, a missing
    name, a higher step, a path out of the folder, or (two deltas) each other."""
    deltas = [n for n in t.checkpoints() if (m := _manifest(t, n)) and m.get("kind") == "delta"]
    if not deltas:
        return None
    name = t.rng.choice(deltas)
    variants = ["self", "missing", "higher", "escape"] + (["cycle"] if len(deltas) > 1 else [])
    variant = t.rng.choice(variants)
    higher = [n for n in t.checkpoints() if n > name]
    parent = {
        "self": name,
        "missing": t.unused_higher(),
        "higher": t.rng.choice(higher) if higher else t.unused_higher(),
        "escape": "../x",
        "cycle": "",
    }[variant]
    if variant == "cycle":
        parent = t.rng.choice([n for n in deltas if n != name])
        back = _manifest(t, parent)
        assert back is not None
        back["parent"] = name
        _write_manifest(t, parent, back)
    manifest = _manifest(t, name)
    assert manifest is not None
    manifest["parent"] = parent
    _write_manifest(t, name, manifest)
    return f"delta_parent {name}: parent {parent!r} ({variant})"


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return list(value)
    return {"was": value}


def manifest_edit(t: Target) -> str | None:
    """Edit a manifest as valid JSON: its step, a key removed, a value of the wrong type,
    a file's or tensor's sha256 replaced by other valid-looking hex, an extra key."""
    names = [n for n in t.checkpoints() if _manifest(t, n) is not None]
    if not names:
        return None
    name = t.rng.choice(names)
    m = _manifest(t, name)
    assert m is not None
    variant = t.rng.choice(["step", "drop", "type", "sha", "extra"])
    if variant == "step":
        old = m.get("step")
        m["step"] = t.rng.choice([s for s in (0, -1, 2, 10**12) if s != old] + [_bump(old)])
        what = f"step {old!r} -> {m['step']!r}"
    elif variant == "drop":
        key = t.rng.choice(sorted(m))
        del m[key]
        what = f"key {key!r} removed"
    elif variant == "type":
        path, parent, key = _pick_value(t.rng, m)
        parent[key] = _wrong_type(parent[key])
        what = f"{path} -> {parent[key]!r}"[:120]
    elif variant == "sha":
        table = t.rng.choice(
            [k for k in ("files", "tensors") if isinstance(m.get(k), dict)] or [""]
        )
        entries = m.get(table) if table else None
        if not isinstance(entries, dict) or not entries:
            return None
        key = t.rng.choice(sorted(entries))
        if not isinstance(entries[key], dict):
            return None
        entries[key]["sha256"] = f"{t.rng.getrandbits(256):064x}"
        what = f"{table}[{key!r}].sha256 replaced"
    else:
        m["comment"] = "added after the save"
        what = "extra key 'comment'"
    _write_manifest(t, name, m)
    return f"manifest_edit {name}: {what}"


def _bump(step: Any) -> Any:
    return step + 2 if isinstance(step, int) and not isinstance(step, bool) else 2


def _pick_value(rng: random.Random, m: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """A top-level key, or (half the time) a field of one file entry."""
    files = m.get("files")
    if rng.random() < 0.5 and isinstance(files, dict) and files:
        name = rng.choice(sorted(files))
        entry = files[name]
        if isinstance(entry, dict) and entry:
            key = rng.choice(sorted(entry))
            return f"files[{name!r}].{key}", entry, key
    key = rng.choice(sorted(m))
    return key, m, key


# -- latest and junk (every checkpoint stays valid) ----------------------------------------


def latest(t: Target) -> str | None:
    """Replace ``latest`` with one of its broken forms."""
    pointer = t.root / LATEST
    ours = t.checkpoints()
    newest = ours[-1] if ours else checkpoint_name(0)
    if _is_real_dir(pointer):
        shutil.rmtree(pointer)
    elif os.path.lexists(pointer):
        pointer.unlink()
    variant = t.rng.choice(LATEST_FORMS)
    if variant == "empty":
        pointer.write_bytes(b"")
    elif variant == "garbage":
        pointer.write_text("the newest one, probably\n")
    elif variant == "binary":
        pointer.write_bytes(t.rng.randbytes(64))
    elif variant == "huge":
        pointer.write_text(newest + "\n")
        os.truncate(pointer, HUGE_LATEST)
    elif variant == "older":
        older = ours[:-1] or ours
        pointer.write_text(t.rng.choice(older) + "\n" if older else "\n")
    elif variant == "missing":
        pointer.write_text(t.unused_higher() + "\n")
    elif variant == "directory":
        pointer.mkdir()
        (pointer / newest).write_text(newest + "\n")
    elif variant == "symlink_to_dir":
        os.symlink(t.rng.choice(ours) if ours else newest, pointer)
    elif variant == "symlink_outside":
        target = t.outside / LATEST
        target.write_text(newest + "\n")
        os.symlink(target, pointer)
    elif variant == "dangling":
        os.symlink("step-gone", pointer)
    elif variant == "fifo":
        os.mkfifo(pointer)
    return f"latest {variant}"


def junk(t: Target) -> str | None:
    """Leave junk beside the checkpoints: a file with a step name, a half-written
    ``.step-N.tmp`` folder, an empty step directory."""
    variant = t.rng.choice(["file", "tmp", "empty_dir"])
    taken = set(_names(t.root))
    if variant == "file":
        name = checkpoint_name(JUNK_STEP)
        name = name if name not in taken else t.unused_higher()
        (t.root / name).write_text("not a checkpoint\n")
        return f"junk file {name}"
    name = t.unused_higher()
    if variant == "empty_dir":
        (t.root / name).mkdir()
        return f"junk empty dir {name}"
    tmp = t.root / f".{name}.tmp"
    tmp.mkdir()
    ours = t.checkpoints()
    if ours:
        newest = t.root / ours[-1]
        for f in _names(newest):
            if _is_real_file(newest / f) and f != MANIFEST:
                data = (newest / f).read_bytes()
                (tmp / f).write_bytes(data[: t.rng.randrange(len(data) + 1)])
    return f"junk partial {tmp.name}"


MUTATIONS: dict[str, Mutation] = {
    "bit_flip": bit_flip,
    "truncate": truncate,
    "zero_page": zero_page,
    "delete_file": delete_file,
    "delete_dir": delete_dir,
    "rename_dir": rename_dir,
    "swap_dirs": swap_dirs,
    "copy_dir": copy_dir,
    "foreign_dir": foreign_dir,
    "symlink": symlink,
    "delta_parent": delta_parent,
    "manifest_edit": manifest_edit,
    "latest": latest,
    "junk": junk,
}
