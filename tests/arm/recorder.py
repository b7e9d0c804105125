"""Record every kernel call a test run makes, with its inputs and outputs, for `replay.cpp`.

`install(path)` wraps the loaded kernel library: each call of an exported ``tk_*`` function
is recorded with the bytes of every buffer it can reach (pointer arguments, and pointers held
in those buffers: a ``tk_attn`` argument struct, its segments, a sublayer plan), before and
after the call. The buffers' extents come from the live objects that own them (torch
storages, numpy arrays, ctypes structs), found with the garbage collector; the smallest
owner of an address is its buffer, and buffers that overlap become one, so aliasing stays.
`save()` writes the calls in the format `replay.cpp` reads (see there).

The outputs recorded on x86 are those the same test run checked against the torch
reference, so the replay on another instruction set checks its kernels against them.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import struct
from pathlib import Path

import numpy as np
import torch

from tightkv.kernels import abi, build

MAX_CALL_BYTES = 4 << 20  # a call reaching more is skipped (whole models' weights)
MAX_PER_KEY = 3  # calls kept per function and scalar arguments
MAX_TOTAL = 400 << 20  # bytes recorded in all
SKIP = {"tk_simd", "tk_gemv_int8", "tk_gemm_rows", "tk_gemm_type", "tk_lowbit_ready"}
# calls that set the library's state for the calls after them: each is recorded, whatever the count
STATE = {"tk_attn_int8"}

# element types: the driver compares floats within a tolerance and the rest exactly
DTYPES = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    np.dtype("float32"): 1,
    np.dtype("float16"): 2,
}
F32, U8 = 1, 0


def _dtype_code(dtype) -> int:
    return DTYPES.get(dtype, U8)


class _Regions:
    """Live buffers by address: (start, end, element type, may hold pointers)."""

    def __init__(self) -> None:
        found: dict[int, tuple[int, int, bool]] = {}
        for obj in gc.get_objects():
            try:
                cls = type(obj)  # not isinstance: that reads __class__, which warns on some torch modules
                if issubclass(cls, torch.Tensor):
                    if obj.device.type != "cpu" or obj.is_sparse:
                        continue
                    st = obj.untyped_storage()
                    start, n = st.data_ptr(), st.nbytes()
                    code, ptrs = _dtype_code(obj.dtype), obj.dtype == torch.int64
                elif issubclass(cls, np.ndarray):
                    if not obj.flags.c_contiguous:
                        continue
                    start, n = obj.__array_interface__["data"][0], obj.nbytes
                    code, ptrs = _dtype_code(obj.dtype), obj.dtype in (np.int64, np.uint64)
                elif issubclass(cls, (ctypes.Structure, ctypes.Array)):
                    start, n, code, ptrs = ctypes.addressof(obj), ctypes.sizeof(obj), U8, True
                else:
                    continue
            except Exception:  # noqa: BLE001, S112 - a half-built or freed object: not a buffer
                continue
            if start and n and n < (1 << 31):
                old = found.get(start)
                if old is None or n < old[0] - start:
                    found[start] = (start + n, code, ptrs)
        self.items = sorted((s, e, c, p) for s, (e, c, p) in found.items())
        self.starts = np.array([s for s, *_ in self.items], dtype=np.uint64)
        self.ends = np.array([e for _, e, *_ in self.items], dtype=np.uint64)

    def owner(self, addr: int):
        """The smallest live buffer holding `addr`, or None."""
        hits = np.nonzero((self.starts <= addr) & (self.ends > addr))[0]
        if not len(hits):
            return None
        return self.items[min(hits, key=lambda i: self.ends[i] - self.starts[i])]


class Recorder:
    """Stands in for the loaded library: records each ``tk_*`` call, then makes it."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self.calls: list[bytes] = []
        self.counts: dict[tuple, int] = {}
        self.total = 0
        self.skipped: dict[str, int] = {}  # calls not recorded: a buffer not found, or too large
        self.int8 = 3  # tk_attn_int8's mask: which attention sides may take the integer paths

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if not name.startswith("tk_") or name in SKIP:
            return fn
        return lambda *args: self._call(name, fn, args)

    def _call(self, name, fn, args):
        if name in STATE:
            if args[0] >= 0:
                self.int8 = int(args[0])
            result = fn(*args)
            self.calls.append(_encode(name, [(0, int(args[0]))], [], [], [], result))
            return result
        key = (*_key(name, args), self.int8)
        if self.counts.get(key, 0) >= MAX_PER_KEY or self.total > MAX_TOTAL:
            return fn(*args)
        regions = _Regions()
        kinds, bufs = _arguments(name, args, regions)
        if bufs is None or sum(e - s for s, e, *_ in bufs) > MAX_CALL_BYTES:
            self.skipped[name] = self.skipped.get(name, 0) + 1
            return fn(*args)
        before = [ctypes.string_at(s, e - s) for s, e, *_ in bufs]
        result = fn(*args)
        after = [ctypes.string_at(s, e - s) for s, e, *_ in bufs]
        record = _encode(name, kinds, bufs, before, after, result)
        self.calls.append(record)
        self.total += len(record)
        self.counts[key] = self.counts.get(key, 0) + 1
        return result

    def save(self, path: Path) -> None:
        with open(path, "wb") as f:
            f.write(b"TKREC1\0\0" + struct.pack("<I", len(self.calls)))
            f.writelines(self.calls)


def _key(name: str, args) -> tuple:
    """What makes calls of a function different enough to keep several of each: the first
    scalar arguments (a weight type, shapes), and for `tk_attn` its segments' storage kinds."""
    if name == "tk_attn":
        a = args[0]._obj
        segs = ctypes.cast(a.segs, ctypes.POINTER(abi.Seg))
        return name, a.D, a.R > a.T, *sorted({(segs[i].kkind, segs[i].vkind) for i in range(a.nseg)})
    scalars = [a for a, t in zip(args, abi.FUNCTIONS[name][1]) if t in (ctypes.c_int, ctypes.c_int64)]
    return name, *scalars[:3]


def _arguments(name, args, regions):
    """Each argument as (kind, value) and the buffers the call reaches (merged where they overlap)."""
    kinds, spans = [], []
    for a, t in zip(args, abi.FUNCTIONS[name][1]):
        if t is ctypes.c_int:
            kinds.append((0, int(a)))
        elif t is ctypes.c_int64:
            kinds.append((1, int(a)))
        elif t is ctypes.c_float:
            kinds.append((2, float(a)))
        else:
            own = None
            if type(a).__name__ == "CArgObject":  # byref(obj)
                a = a._obj
            if isinstance(a, bytes):  # ctypes passes the bytes' own buffer
                addr = ctypes.cast(ctypes.c_char_p(a), ctypes.c_void_p).value
                own = (addr, addr + len(a), U8, False)
            elif (
                isinstance(a, ctypes._SimpleCData)
                and not isinstance(a, ctypes.c_void_p)
                or isinstance(a, (ctypes.Array, ctypes.Structure))
            ):
                addr = ctypes.addressof(a)
                own = (addr, addr + ctypes.sizeof(a), U8, not isinstance(a, ctypes._SimpleCData))
            else:
                addr = a.value if isinstance(a, ctypes.c_void_p) else a
            if not addr:
                kinds.append((4, 0))
                continue
            own = own or regions.owner(int(addr))
            if own is None:
                return None, None
            kinds.append((3, int(addr)))
            spans.append(own)
    # pointers held in buffers that may hold them (structs, int64 plans), to any depth
    seen, todo = {s[0] for s in spans}, list(spans)
    while todo:
        s, e, _, ptrs = todo.pop()
        if not ptrs or e - s > (1 << 20):
            continue
        words = np.frombuffer(ctypes.string_at(s, (e - s) // 8 * 8), dtype=np.uint64)
        for w in words[(words > 0x10000) & (words < (1 << 48))]:
            own = regions.owner(int(w))
            if own is not None and own[0] not in seen:
                seen.add(own[0])
                spans.append(own)
                todo.append(own)
    return kinds, _merge(spans)


def _merge(spans):
    out = []
    for s, e, c, p in sorted(spans):
        if out and s < out[-1][1]:
            ps, pe, pc, pp = out[-1]
            out[-1] = (ps, max(pe, e), pc if pe - ps >= e - s else c, pp or p)
        else:
            out.append((s, e, c, p))
    return out


def _locate(bufs, addr):
    for i, (s, e, *_) in enumerate(bufs):
        if s <= addr < e:
            return i, addr - s
    return None


def _encode(name, kinds, bufs, before, after, result) -> bytes:
    """One call: name, buffers (type, size, pointer fixes, bytes before, and after where they changed), arguments,
    and the result (-1 << 62 for a void function)."""
    out = [struct.pack("<H", len(name)), name.encode(), struct.pack("<I", len(bufs))]
    for (s, e, code, ptrs), b0, b1 in zip(bufs, before, after):
        fixes = []
        if ptrs and e - s <= (1 << 20):
            words = np.frombuffer(b0[: (e - s) // 8 * 8], dtype=np.uint64)
            for j in np.nonzero((words > 0x10000) & (words < (1 << 48)))[0]:
                hit = _locate(bufs, int(words[j]))
                if hit is not None:
                    fixes.append((8 * int(j), *hit))
        out.append(struct.pack("<BQIB", code, e - s, len(fixes), b1 != b0))
        out.extend(struct.pack("<QIQ", off, tb, toff) for off, tb, toff in fixes)
        out += [b0, b1] if b1 != b0 else [b0]
    out.append(struct.pack("<I", len(kinds)))
    for kind, value in kinds:
        if kind == 3:
            buf, off = _locate(bufs, value)
            out.append(struct.pack("<BIQ", 3, buf, off))
        elif kind == 2:
            out.append(struct.pack("<Bf", 2, value))
        else:
            out.append(struct.pack("<Bq", kind, value))
    out.append(struct.pack("<q", -(1 << 62) if result is None else int(result)))
    return b"".join(out)


def install(path: str) -> Recorder:
    """Wrap the loaded kernel library in a recorder that writes its calls to `path` at exit."""
    lib = build.library()
    if lib is None:
        raise RuntimeError(f"no kernel library to record: {build.status()}")
    rec = Recorder(lib)
    build._lib = rec
    from tightkv.gguf.quants import kernel_tables

    for i, table in enumerate(kernel_tables()):  # the replay hands the tables over first, as build.py does
        held = torch.from_numpy(table)  # a tensor, so the recorder finds its buffer (arrays are not tracked)
        rec.tk_lowbit_table(i, held.data_ptr(), table.nbytes)

    def _save():
        rec.save(Path(path))
        print(f"recorded {len(rec.calls)} kernel calls ({rec.total >> 20} MiB; not recorded: {rec.skipped}) to {path}")

    atexit.register(_save)
    return rec
