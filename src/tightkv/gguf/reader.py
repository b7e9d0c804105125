"""Open a GGUF file through the `gguf` package: metadata as plain Python values,
tensors as zero-copy views of the memory-mapped file.

Every way a file can be wrong becomes a one-line `GGUFError` naming the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import GGUFError

GGUF_MAGIC = b"GGUF"


@dataclass
class TensorInfo:
    """One tensor of a GGUF file, its data left in the memory map."""

    name: str
    qtype: str  # GGML type name, e.g. "Q4_K"
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix
    data: np.ndarray  # uint8 (rows, row_bytes) for block types, typed otherwise


@dataclass
class GGUFFile:
    """A parsed GGUF: metadata values and tensor views."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def _compact_reader_class():
    """`gguf.GGUFReader`, except that arrays are read in bulk.

    The stock reader makes two numpy views per element of every array: for a
    262,144-token vocabulary that is ~9 s and ~500 MB of Python objects. Here a
    numeric array becomes one numpy array and a string array one list of str.
    """
    import struct

    import gguf
    from gguf import GGUFValueType

    class CompactReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            self.arrays: dict[str, Any] = {}
            self._pending: Any = None
            super().__init__(path, mode)

        def _get_field_parts(self, orig_offs, raw_type):
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            start, count = orig_offs + 12, int(alen[0])
            itype = GGUFValueType(int(raw_itype[0]))
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                values = self._get(start, nptype, count)
                self._pending = np.array(values)
                end = start + values.nbytes
            elif itype == GGUFValueType.STRING:
                view, strings, offs = memoryview(self.data), [], start
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", view, offs)
                    strings.append(bytes(view[offs + 8 : offs + 8 + n]).decode("utf-8", errors="replace"))
                    offs += 8 + n
                self._pending, end = strings, offs
            else:
                return super()._get_field_parts(orig_offs, raw_type)
            return end - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, itype]

        def _build_tensors(self, start_offs, fields):
            """gguf-py's, plus the block types its installed version does not name (Q2_0 ...);
            a file that ends before its tensors' data does is a `GGUFError` naming the tensor
            cut short (gguf-py's own error is numpy's failed reshape)."""
            _check_tensor_data(fields, start_offs, len(self.data))
            known = [f for f in fields if int(f.parts[4][0]) in gguf.GGMLQuantizationType._value2member_map_]
            super()._build_tensors(start_offs, known)
            built = {t.name: t for t in self.tensors}
            self.tensors = [built.get(bytes(f.parts[1]).decode()) or _extra_tensor(self, start_offs, f) for f in fields]

        def _push_field(self, field, skip_sum=False):
            if self._pending is not None:
                self.arrays[field.name] = self._pending
                self._pending = None
            return super()._push_field(field, skip_sum)

    return CompactReader


def _tensor_span(field, start_offs: int) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, type name, numpy shape, data offset, data bytes) of a tensor-info field."""
    import gguf

    _, name, _, dims, raw_type, offset = field.parts
    type_id = int(raw_type[0])
    n_elems = int(np.prod(dims))
    if type_id in gguf.GGMLQuantizationType._value2member_map_:
        qtype = gguf.GGMLQuantizationType(type_id)
        (block, size), type_name = gguf.GGML_QUANT_SIZES[qtype], qtype.name
    else:
        from . import quants  # torch: only for files that need it

        type_name = quants.EXTRA_TYPE_IDS.get(type_id)
        if type_name is None:
            raise ValueError(f"tensor {bytes(name).decode()}: unknown tensor type id {type_id}")
        block, size = quants.BLOCK_SIZES[type_name]
    shape = tuple(reversed([int(d) for d in dims.tolist()]))
    return bytes(name).decode(errors="replace"), type_name, shape, int(start_offs + offset[0]), n_elems // block * size


def _check_tensor_data(fields, start_offs: int, file_size: int) -> None:
    """Raise a one-line `GGUFError` when the file ends before its tensors' data does: the
    first tensor cut short, how much of it is there, and how short the file is."""
    spans = sorted((_tensor_span(f, start_offs) for f in fields), key=lambda t: t[3])
    cut = [t for t in spans if t[3] + t[4] > file_size]
    if not cut:
        return
    name, qtype, shape, start, n_bytes = cut[0]
    have = max(0, file_size - start)
    need = max(t[3] + t[4] for t in spans)
    more = len(cut) - 1
    after = (
        f", and the {more} tensor{'s' if more > 1 else ''} after it {'are' if more > 1 else 'is'} missing"
        if more
        else ""
    )
    dims = " x ".join(str(d) for d in shape)
    size = _size if _size(file_size) != _size(need) else (lambda n: f"{n:,} bytes")
    raise GGUFError(
        f"truncated GGUF: tensor {name} ({qtype}, {dims}) is cut short by {_size(n_bytes - have)} "
        f"({_size(have)} of its {_size(n_bytes)} present){after}: the file is {size(file_size)} of the "
        f"{size(need)} its tensors need (download it again)"
    )


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


class _ExtraType(NamedTuple):
    """A GGML type id gguf-py does not know, by the name our codecs give it."""

    name: str
    value: int


def _extra_tensor(reader, start_offs: int, field):
    """A `gguf.ReaderTensor` for a block type in `quants.EXTRA_TYPE_IDS` (uint8 row bytes)."""
    from gguf import ReaderTensor

    from . import quants  # torch: only for files that need it

    _, name, _, dims, raw_type, offset = field.parts
    name, type_id = bytes(name).decode(), int(raw_type[0])
    if type_id not in quants.EXTRA_TYPE_IDS:
        raise ValueError(f"tensor {name}: unknown tensor type id {type_id}")
    qtype = quants.EXTRA_TYPE_IDS[type_id]
    block, size = quants.BLOCK_SIZES[qtype]
    n_elems, rows = int(np.prod(dims)), tuple(reversed(dims.tolist()))
    n_bytes, data_offs = n_elems // block * size, int(start_offs + offset[0])
    data = reader._get(data_offs, np.uint8, n_bytes).reshape(*rows[:-1], quants.row_bytes(qtype, rows[-1]))
    return ReaderTensor(
        name=name,
        tensor_type=_ExtraType(qtype, type_id),
        shape=dims,
        n_elements=n_elems,
        n_bytes=n_bytes,
        data_offset=data_offs,
        data=data,
        field=field,
    )


def _field_value(reader, name: str, field) -> Any:
    if name in reader.arrays:
        return reader.arrays[name]
    value = field.contents()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _check_header(path: Path) -> None:
    if not path.exists():
        raise GGUFError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    size = path.stat().st_size
    if size < 24:
        raise GGUFError(f"{path}: truncated GGUF ({size} bytes)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic {magic!r})")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse a GGUF file's header and map its tensors without copying them.

    Raises `GGUFError` with a one-line message for a missing, truncated, corrupt
    or otherwise unreadable file.
    """
    path = Path(path)
    _check_header(path)
    try:
        reader = _compact_reader_class()(path, "r")
    except GGUFError as err:
        raise GGUFError(f"{path}: {err}") from None
    except Exception as err:  # the gguf package raises many kinds on bad files
        raise GGUFError(f"{path}: corrupt or truncated GGUF ({_short(err)})") from None
    metadata = {
        name: _field_value(reader, name, f) for name, f in reader.fields.items() if not name.startswith("GGUF.")
    }
    tensors = {}
    file_size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > file_size:
            raise GGUFError(f"{path}: truncated GGUF (tensor {t.name} ends past the end of the file)")
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        tensors[t.name] = TensorInfo(t.name, t.tensor_type.name, shape, t.data)
    return GGUFFile(path, metadata, tensors)


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
