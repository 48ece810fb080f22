"""Delta checkpoints: a tensor state stored as compressed XORs against a base state.

A training state is split into its tensors (keyed by dotted path) and a skeleton: the same
nested dicts/lists/tuples with each tensor replaced by a `TensorRef`. Tensors viewing the same
memory the same way (tied weights) are stored once and share one ref, as torch.save does.
Each tensor's raw bytes are XORed with those of the same-path base tensor (the last full
checkpoint) when dtype and shape match (kind ``"xor"``), or its elements' bit patterns are
subtracted as unsigned integers, wrapping (kind ``"sub"``), or it is kept whole (kind
``"raw"``), whichever compresses smallest; the result is byte-plane shuffled and compressed
with zstandard.

Why XOR + shuffle: between nearby steps most floats keep their sign and exponent, so the XOR
of the two bit patterns is zero in the high byte and often in the next. Shuffling puts byte k
of every element together (as Blosc's shuffle filter does), so those bytes form low-entropy
planes that zstd's entropy coder shrinks well, while the noisy low mantissa planes cost about
their size. XOR is exact and its own inverse: no float arithmetic, bit-exact by construction.

Binary format (no pickle anywhere)::

    b"TRDELTA1"                      magic, 8 bytes
    u64 little-endian                length of the header in bytes
    32 bytes                         sha256 of the header bytes
    header                           UTF-8 JSON: {"format": 1, "tensors": [...], "skeleton": ...}
    payloads                         concatenated, in header order, without gaps

Each header tensor entry holds path, dtype, shape, kind, offset and length (within the payload
section) and the sha256 of the tensor's decoded raw bytes, which `decode_delta` checks: a
corrupt delta, or one decoded against the wrong base, names the tensor that fails. The
header's own sha256 covers the rest (entries and the plain values in the skeleton). The
skeleton is JSON with tagged nodes so that types survive: ``{"$dict": [[key, value], ...]}``
(keys of any leaf type, e.g. the int keys of optimizer state), ``{"$tuple": [...]}``,
``{"$tensor": path}`` and ``{"$float": "nan" | "inf" | "-inf"}``.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import zstandard

MAGIC = b"TRDELTA1"
FORMAT_VERSION = 1
KINDS = ("xor", "sub", "raw")
_UINTS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_PREAMBLE = struct.Struct("<8sQ32s")  # magic, header length, header sha256
_ENTRY_KEYS = {"path", "dtype", "shape", "kind", "offset", "length", "sha256"}
_NONFINITE = ("nan", "inf", "-inf")

Bytes = npt.NDArray[np.uint8]


class DeltaError(ValueError):
    """A delta blob that is malformed or corrupt, or that does not fit the given base."""


@dataclass(frozen=True, slots=True)
class TensorRef:
    """Placeholder for a tensor inside a skeleton."""

    path: str


@dataclass(frozen=True, slots=True)
class EncodedTensor:
    """One tensor of a delta: where it goes, how it was encoded, its compressed bytes."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    kind: str
    payload: bytes
    sha256: str
    """Hex sha256 of the tensor's raw bytes after decoding."""


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _is_leaf(node: object) -> bool:
    return node is None or isinstance(node, (bool, int, float, str))


def flatten_tensors(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested state into {dotted_path: tensor} and a skeleton with `TensorRef`s."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple[Any, ...], str] = {}  # aliases (tied weights) are stored once

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            alias = (node.device, node.data_ptr(), node.dtype, node.shape, node.stride())
            if node.numel() and alias in seen:
                return TensorRef(seen[alias])
            if path in tensors:
                raise DeltaError(f"two tensors of the state share the path {path!r}")
            tensors[path] = node
            seen[alias] = path
            return TensorRef(path)
        if isinstance(node, dict):
            for key in node:
                if not (_is_leaf(key) or isinstance(key, tuple)):
                    raise DeltaError(f"unsupported {type(key).__name__} dict key at {path!r}")
            return {key: walk(value, _join(path, key)) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            items = [walk(value, _join(path, i)) for i, value in enumerate(node)]
            return items if isinstance(node, list) else tuple(items)
        if _is_leaf(node):
            return node
        raise DeltaError(f"unsupported {type(node).__name__} in the state at {path!r}")

    return tensors, walk(state, "")


def unflatten_tensors(tensors: dict[str, torch.Tensor], skeleton: Any) -> Any:
    """Put tensors back into the skeleton `flatten_tensors` made (the inverse of it)."""

    def build(node: Any) -> Any:
        if isinstance(node, TensorRef):
            if node.path not in tensors:
                raise DeltaError(f"the skeleton needs tensor {node.path!r}, which is missing")
            return tensors[node.path]
        if isinstance(node, dict):
            return {key: build(value) for key, value in node.items()}
        if isinstance(node, list):
            return [build(value) for value in node]
        if isinstance(node, tuple):
            return tuple(build(value) for value in node)
        return node

    return build(skeleton)


def shuffle_bytes(raw: Bytes, itemsize: int) -> Bytes:
    """Byte-plane shuffle: byte 0 of every element, then every byte 1, and so on (a copy)."""
    if itemsize < 1 or raw.size % itemsize:
        raise ValueError(f"{raw.size} bytes are not a whole number of {itemsize}-byte items")
    return raw.reshape(-1, itemsize).T.copy().reshape(-1)


def unshuffle_bytes(shuffled: Bytes, itemsize: int) -> Bytes:
    """Invert `shuffle_bytes` (a copy)."""
    if itemsize < 1 or shuffled.size % itemsize:
        raise ValueError(f"{shuffled.size} bytes are not a whole number of {itemsize}-byte items")
    return shuffled.reshape(itemsize, -1).T.copy().reshape(-1)


def _raw_bytes(tensor: torch.Tensor) -> Bytes:
    """The tensor's bytes in memory order, as a flat uint8 array (no float conversion)."""
    if tensor.layout != torch.strided:
        raise DeltaError(f"cannot store a {tensor.layout} tensor in a delta")
    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DeltaError(f"unknown tensor dtype {name!r} in delta")
    return dtype


def _fits(ref: torch.Tensor | None, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    return ref is not None and ref.dtype == dtype and tuple(ref.shape) == shape


def _against(kind: str, raw: Bytes, ref: Bytes, itemsize: int) -> Bytes:
    """The bytes stored for ``raw`` against ``ref``: XOR, or wrapping integer subtraction of
    the elements' bit patterns (smaller for values that drift steadily, like Adam's second
    moment)."""
    if kind == "xor" or raw.size == 0:
        return np.bitwise_xor(raw, ref)
    uint = _UINTS[itemsize]
    return np.ascontiguousarray(np.subtract(raw.view(uint), ref.view(uint)).view(np.uint8))


def _restore(kind: str, data: Bytes, ref: Bytes, itemsize: int) -> Bytes:
    """Invert `_against`."""
    if kind == "xor" or data.size == 0:
        return np.bitwise_xor(data, ref)
    uint = _UINTS[itemsize]
    return np.ascontiguousarray(np.add(data.view(uint), ref.view(uint)).view(np.uint8))


def encode_delta(state: Any, base: Any, *, level: int = 3, threads: int = 0) -> DeltaBlob:
    """Encode ``state`` against ``base`` (None: every tensor raw). Each tensor with a base
    twin is stored as whichever of XOR, subtraction or itself compresses smallest."""
    tensors, skeleton = flatten_tensors(state)
    base_tensors = flatten_tensors(base)[0]
    cctx = zstandard.ZstdCompressor(level=level, threads=threads)
    encoded = []
    for path, tensor in tensors.items():
        raw = _raw_bytes(tensor)
        shape, size = tuple(tensor.shape), tensor.element_size()
        ref = base_tensors.get(path)
        options = {"raw": cctx.compress(shuffle_bytes(raw, size).data)}
        if ref is not None and _fits(ref, tensor.dtype, shape):
            ref_raw = _raw_bytes(ref)
            for kind in ("xor", "sub"):
                data = _against(kind, raw, ref_raw, size)
                options[kind] = cctx.compress(shuffle_bytes(data, size).data)
        kind = min(options, key=lambda k: (len(options[k]), k != "xor"))
        name = str(tensor.dtype).removeprefix("torch.")
        digest = hashlib.sha256(raw.data).hexdigest()
        encoded.append(EncodedTensor(path, name, shape, kind, options[kind], digest))
    return DeltaBlob(tuple(encoded), skeleton)


def decode_delta(blob: DeltaBlob, base: Any) -> Any:
    """Rebuild the full state from ``blob`` and the base it was encoded against, bit-exactly."""
    base_tensors = flatten_tensors(base)[0]
    dctx = zstandard.ZstdDecompressor()
    tensors: dict[str, torch.Tensor] = {}
    for enc in blob.tensors:
        dtype = _dtype(enc.dtype)
        size = math.prod(enc.shape) * dtype.itemsize
        try:
            declared = zstandard.frame_content_size(enc.payload)
            if declared != size:
                raise DeltaError(f"tensor {enc.path!r}: payload has {declared} bytes, not {size}")
            data = dctx.decompress(enc.payload, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise DeltaError(f"tensor {enc.path!r}: payload does not decompress: {exc}") from exc
        if len(data) != size:  # a frame that lies about its content size
            raise DeltaError(f"tensor {enc.path!r}: payload has {len(data)} bytes, not {size}")
        raw = unshuffle_bytes(np.frombuffer(data, dtype=np.uint8), dtype.itemsize)
        if enc.kind != "raw":
            ref = base_tensors.get(enc.path)
            if ref is None or not _fits(ref, dtype, enc.shape):
                have = "nothing" if ref is None else f"{ref.dtype} {list(ref.shape)}"
                raise DeltaError(
                    f"tensor {enc.path!r} is a delta against a {enc.dtype} {list(enc.shape)} "
                    f"base tensor, but the base has {have} there"
                )
            raw = _restore(enc.kind, raw, _raw_bytes(ref), dtype.itemsize)
        digest = hashlib.sha256(raw.data).hexdigest()
        if digest != enc.sha256:
            raise DeltaError(
                f"tensor {enc.path!r} decodes to sha256 {digest[:16]}… but the delta records "
                f"{enc.sha256[:16]}…: the delta is corrupt or this is not its base"
            )
        if raw.size == 0:  # numpy gives empty arrays stride 0, which torch cannot view
            tensors[enc.path] = torch.empty(enc.shape, dtype=dtype)
            continue
        tensors[enc.path] = torch.from_numpy(raw).view(dtype).reshape(enc.shape)
    return unflatten_tensors(tensors, blob.skeleton)


def _skeleton_to_json(node: Any) -> Any:
    if isinstance(node, TensorRef):
        return {"$tensor": node.path}
    if isinstance(node, float) and not math.isfinite(node):
        return {"$float": repr(node)}
    if _is_leaf(node):
        return node
    if isinstance(node, list):
        return [_skeleton_to_json(value) for value in node]
    if isinstance(node, tuple):
        return {"$tuple": [_skeleton_to_json(value) for value in node]}
    if isinstance(node, dict):
        return {"$dict": [[_skeleton_to_json(k), _skeleton_to_json(v)] for k, v in node.items()]}
    raise DeltaError(f"cannot store a {type(node).__name__} in a delta skeleton")


def _skeleton_from_json(node: Any) -> Any:
    if _is_leaf(node):
        return node
    if isinstance(node, list):
        return [_skeleton_from_json(value) for value in node]
    if isinstance(node, dict) and len(node) == 1:
        ((tag, value),) = node.items()
        if tag == "$tensor" and isinstance(value, str):
            return TensorRef(value)
        if tag == "$float" and value in _NONFINITE:
            return float(value)
        if tag == "$tuple" and isinstance(value, list):
            return tuple(_skeleton_from_json(item) for item in value)
        if tag == "$dict" and isinstance(value, list):
            out = {}
            for pair in value:
                if not (isinstance(pair, list) and len(pair) == 2):
                    break
                key = _skeleton_from_json(pair[0])
                try:
                    out[key] = _skeleton_from_json(pair[1])
                except TypeError:
                    break
            else:
                return out
    raise DeltaError(f"delta skeleton has a malformed node: {json.dumps(node)[:100]}")


def _tensor_refs(node: Any) -> list[str]:
    if isinstance(node, TensorRef):
        return [node.path]
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        return [path for value in node for path in _tensor_refs(value)]
    return []


def _reject_constant(name: str) -> Any:
    raise DeltaError(f"delta header is not strict JSON: it contains {name}")


def _entry(raw: Any, index: int) -> tuple[str, str, tuple[int, ...], str, int, int, str]:
    """Validate one header tensor entry; returns its fields."""
    if not isinstance(raw, dict) or set(raw) != _ENTRY_KEYS:
        raise DeltaError(f"delta header tensor #{index} lacks the keys {sorted(_ENTRY_KEYS)}")
    path, dtype, shape, kind = raw["path"], raw["dtype"], raw["shape"], raw["kind"]
    offset, length, sha = raw["offset"], raw["length"], raw["sha256"]

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    shape_ok = isinstance(shape, list) and all(count(d) for d in shape)
    sha_ok = isinstance(sha, str) and len(sha) == 64 and set(sha) <= set("0123456789abcdef")
    if not (isinstance(path, str) and isinstance(dtype, str) and shape_ok and kind in KINDS):
        raise DeltaError(f"delta header tensor #{index} ({path!r}) has a bad dtype/shape/kind")
    if not (count(offset) and count(length) and sha_ok):
        raise DeltaError(f"delta header tensor #{index} ({path!r}) has a bad offset/length/sha256")
    _dtype(dtype)
    return path, dtype, tuple(shape), kind, offset, length, sha


@dataclass(frozen=True, slots=True)
class DeltaBlob:
    """An encoded delta: its tensors and the skeleton that puts them back in place."""

    tensors: tuple[EncodedTensor, ...]
    skeleton: Any

    def to_bytes(self) -> bytes:
        """Serialize: magic, length-prefixed JSON header, then the payloads."""
        entries, offset = [], 0
        for t in self.tensors:
            entry = {"path": t.path, "dtype": t.dtype, "shape": list(t.shape), "kind": t.kind}
            entries.append(entry | {"offset": offset, "length": len(t.payload), "sha256": t.sha256})
            offset += len(t.payload)
        doc = {"format": FORMAT_VERSION, "tensors": entries}
        doc["skeleton"] = _skeleton_to_json(self.skeleton)
        header = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode("utf-8")
        preamble = _PREAMBLE.pack(MAGIC, len(header), hashlib.sha256(header).digest())
        return b"".join([preamble, header, *(t.payload for t in self.tensors)])

    @classmethod
    def from_bytes(cls, data: bytes) -> DeltaBlob:
        """Parse and validate what `to_bytes` wrote; raises DeltaError on anything malformed."""
        data = data if isinstance(data, bytes) else bytes(data)
        if len(data) < _PREAMBLE.size:
            raise DeltaError(f"delta blob is {len(data)} bytes, shorter than its preamble")
        magic, header_len, header_sha = _PREAMBLE.unpack_from(data)
        if magic != MAGIC:
            raise DeltaError(f"not a delta blob: magic {magic!r}, expected {MAGIC!r}")
        start = _PREAMBLE.size + header_len
        if start > len(data):
            raise DeltaError(f"delta header ends at byte {start} of {len(data)}: truncated")
        if hashlib.sha256(data[_PREAMBLE.size : start]).digest() != header_sha:
            raise DeltaError("delta header does not match its sha256: the header is corrupt")
        try:
            text = data[_PREAMBLE.size : start].decode("utf-8")
            doc = json.loads(text, parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise DeltaError(f"delta header is not valid JSON: {exc}") from exc
        if not (isinstance(doc, dict) and set(doc) == {"format", "tensors", "skeleton"}):
            raise DeltaError("delta header must hold exactly format, tensors and skeleton")
        if doc["format"] != FORMAT_VERSION or not isinstance(doc["tensors"], list):
            raise DeltaError(f"delta header has format {doc['format']!r}; expected 1")
        n, tensors, expected = len(doc["tensors"]), [], 0
        for index, raw in enumerate(doc["tensors"]):
            path, dtype, shape, kind, offset, length, sha = _entry(raw, index)
            end = start + offset + length
            if end > len(data):
                raise DeltaError(
                    f"delta header names {n} tensors but payload of {path!r} ends at byte "
                    f"{end} of {len(data)}"
                )
            if offset != expected:
                raise DeltaError(f"payload of {path!r} starts at {offset}, expected {expected}")
            expected = offset + length
            payload = data[start + offset : end]
            tensors.append(EncodedTensor(path, dtype, shape, kind, payload, sha))
        if start + expected != len(data):
            raise DeltaError(f"delta blob has {len(data) - start - expected} trailing bytes")
        skeleton = _skeleton_from_json(doc["skeleton"])
        refs, paths = _tensor_refs(skeleton), [t.path for t in tensors]
        if len(set(paths)) != n or set(refs) != set(paths):
            raise DeltaError("delta skeleton and tensor list do not name the same tensors")
        return cls(tuple(tensors), skeleton)
