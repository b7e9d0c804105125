"""The kernel ABI cannot drift: `kernels/abi.py` against the C++ declarations in `csrc/`.

A light parser reads the declarations Python mirrors (``enum Kind``, the weight types of
``DISPATCH``, each struct of `abi.STRUCTS`, every ``extern "C"`` function) and the checks
compare names, order, types, offsets and sizes with the ctypes side. The parser is tested
too: a field or enum value added, dropped or moved on one side only must be reported."""

from __future__ import annotations

import ctypes
import enum
import re
import types

import pytest

from tightkv.kernels import abi
from tightkv.kernels.build import SOURCE_DIR

C_SCALARS = {  # C type -> (ctypes type, size and alignment)
    "int64_t": (ctypes.c_int64, 8),
    "int32_t": (ctypes.c_int32, 4),
    "int": (ctypes.c_int, 4),
    "float": (ctypes.c_float, 4),
    "double": (ctypes.c_double, 8),
    "uint8_t": (ctypes.c_uint8, 1),
    "bool": (ctypes.c_bool, 1),
}
POINTER_SIZE = 8


def source() -> str:
    """Every C++ source and header in csrc/, comments removed."""
    text = "\n".join(p.read_text() for p in sorted(SOURCE_DIR.iterdir()) if p.suffix in (".cpp", ".h"))
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.DOTALL)


# --- the parser ------------------------------------------------------------------------
def c_enum(src: str, name: str) -> list[tuple[str, int]]:
    """(name, value) of each enumerator of ``enum name {...}``, in order."""
    found = re.findall(rf"\benum\s+{name}\s*\{{(.*?)\}}\s*;", src, re.DOTALL)
    assert len(found) == 1, f"enum {name}: {len(found)} declarations"
    out, value = [], -1
    for item in filter(None, (x.strip() for x in found[0].split(","))):
        m = re.fullmatch(r"(\w+)(?:\s*=\s*(-?\d+))?", item)
        assert m, f"enum {name}: cannot read {item!r}"
        value = int(m.group(2)) if m.group(2) is not None else value + 1
        out.append((m.group(1), value))
    return out


def c_struct(src: str, name: str) -> list[tuple[str, str, bool, tuple[int, ...]]]:
    """(field, base type, pointer, array dims) of each member of ``struct name {...}``, in order."""
    found = re.findall(rf"\bstruct\s+{name}\s*\{{([^{{}}]*)\}}\s*;", src)
    assert len(found) == 1, f"struct {name}: {len(found)} declarations"
    fields = []
    for decl in filter(None, (d.strip() for d in found[0].split(";"))):
        m = re.fullmatch(r"(?:const\s+)?([\w:]+)\s+(.+)", decl, re.DOTALL)
        assert m, f"struct {name}: cannot read {decl!r}"
        base = m.group(1).rpartition("::")[2]
        for item in m.group(2).split(","):
            d = re.fullmatch(r"\s*(\**)\s*(?:const\s+)?(\w+)\s*((?:\[\d+\])*)\s*", item)
            assert d, f"struct {name}: cannot read {item!r}"
            dims = tuple(int(x) for x in re.findall(r"\[(\d+)\]", d.group(3)))
            fields.append((d.group(2), base, bool(d.group(1)), dims))
    return fields


def c_functions(src: str) -> dict[str, tuple[str, list[tuple[str, bool]]]]:
    """name: (result type, [(base type, pointer) per parameter]) of each ``extern "C"`` function."""
    out = {}
    for res, name, params in re.findall(r'extern\s+"C"\s+(\w+)\s+(tk_\w+)\s*\(([^)]*)\)', src):
        args = []
        for p in filter(None, (x.strip() for x in params.split(","))):
            p = re.sub(r"\bconst\b", " ", p)
            base = p.replace("*", " ").split()[0].rpartition("::")[2]
            args.append((base, "*" in p))
        out[name] = (res, args)
    return out


def c_layout(src: str, name: str) -> tuple[dict[str, int], int, int]:
    """Offsets of a struct's fields, its size and alignment, by the C rules (natural alignment)."""
    offsets, off, align = {}, 0, 1
    for field, base, pointer, dims in c_struct(src, name):
        if pointer:
            size = falign = POINTER_SIZE
        elif base in C_SCALARS:
            size = falign = C_SCALARS[base][1]
        else:
            _, size, falign = c_layout(src, base)
        for n in dims:
            size *= n
        off = -(-off // falign) * falign
        offsets[field] = off
        off += size
        align = max(align, falign)
    return offsets, -(-off // align) * align, align


# --- the checks ------------------------------------------------------------------------
def _ctype_matches(src: str, t, base: str, pointer: bool, dims: tuple[int, ...]) -> bool:
    for n in dims:
        if not (isinstance(t, type) and issubclass(t, ctypes.Array) and t._length_ == n):
            return False
        t = t._type_
    if pointer:
        if t is ctypes.c_void_p:
            return True
        return isinstance(t, type) and issubclass(t, ctypes._Pointer) and getattr(t._type_, "__name__", "") == base
    if base in C_SCALARS:
        return t is C_SCALARS[base][0]
    return (
        isinstance(t, type) and issubclass(t, ctypes.Structure) and t.__name__ == base and not struct_problems(src, t)
    )


def struct_problems(src: str, cls) -> list[str]:
    """How a ctypes.Structure differs from the C++ struct of its name (empty: it does not)."""
    c = c_struct(src, cls.__name__)
    py = list(cls._fields_)
    if [f[0] for f in c] != [f[0] for f in py]:
        return [f"{cls.__name__}: C++ fields {[f[0] for f in c]}, Python {[f[0] for f in py]}"]
    out = []
    for (field, base, pointer, dims), (_, t) in zip(c, py):
        if not _ctype_matches(src, t, base, pointer, dims):
            out.append(f"{cls.__name__}.{field}: C++ {base}{'*' if pointer else ''}{list(dims) or ''}, Python {t}")
    offsets, size, _ = c_layout(src, cls.__name__)
    for field, off in offsets.items():
        if getattr(cls, field).offset != off:
            out.append(f"{cls.__name__}.{field}: offset {off} in C++, {getattr(cls, field).offset} in Python")
    if ctypes.sizeof(cls) != size:
        out.append(f"{cls.__name__}: {size} bytes in C++, {ctypes.sizeof(cls)} in Python")
    for expr in re.findall(rf"static_assert\(\s*sizeof\({cls.__name__}\)\s*==\s*([\d\s*]+),", src):
        stated = eval(expr)  # digits and '*' only
        if stated != ctypes.sizeof(cls):
            out.append(f"{cls.__name__}: static_assert says {stated} bytes, Python has {ctypes.sizeof(cls)}")
    return out


def kind_problems(src: str, kind=abi.Kind, nkinds: int = abi.NKINDS) -> list[str]:
    c = c_enum(src, "Kind")
    values = [(n, v) for n, v in c if n != "NKINDS"]
    out = []
    if values != [(m.name, m.value) for m in kind]:
        out.append(f"enum Kind: C++ {values}, Python {[(m.name, m.value) for m in kind]}")
    if dict(c).get("NKINDS") != nkinds:
        out.append(f"NKINDS: C++ {dict(c).get('NKINDS')}, Python {nkinds}")
    return out


def type_problems(src: str, block_types=abi.BLOCK_TYPES) -> list[str]:
    macros = re.findall(r"#define\s+CASES\(CALL\)(.*?)\nTYPE_GROUP", src, re.DOTALL)  # one per type group
    assert macros, "CASES not found"
    found = re.findall(r"case\s+(\d+)\s*:\s*return\s+CALL\((\w+)\)", "".join(macros))
    cases = sorted((int(n), t) for n, t in found)
    out = []
    if cases != list(enumerate(block_types)):
        out.append(f"CASES: C++ {cases}, Python {list(enumerate(block_types))}")
    ntypes = re.findall(r"static\s+const\s+int\s+NTYPES\s*=\s*(\d+)\s*;", src)
    if ntypes != [str(len(block_types))]:
        out.append(f"NTYPES: C++ {ntypes}, Python {len(block_types)}")
    return out


def function_problems(src: str, functions=abi.FUNCTIONS) -> list[str]:
    c = c_functions(src)
    out = []
    if set(c) != set(functions):
        out.append(
            f"exported functions: only in C++ {set(c) - set(functions)}, only in Python {set(functions) - set(c)}"
        )
    for name in sorted(set(c) & set(functions)):
        (cres, cargs), (pres, pargs) = c[name], functions[name]
        if (pres is None) != (cres == "void") or (pres is not None and pres is not C_SCALARS[cres][0]):
            out.append(f"{name}: returns {cres} in C++, {pres} in Python")
        if len(cargs) != len(pargs) or not all(
            _ctype_matches(src, t, base, pointer, ()) for (base, pointer), t in zip(cargs, pargs)
        ):
            out.append(f"{name}: C++ takes {cargs}, Python {pargs}")
    return out


# --- the tests -------------------------------------------------------------------------
def test_kinds_match_the_cpp_enum():
    assert kind_problems(source()) == []


def test_weight_type_numbers_match_the_cpp_dispatch():
    assert type_problems(source()) == []


@pytest.mark.parametrize("cls", abi.STRUCTS, ids=lambda c: c.__name__)
def test_structs_match_the_cpp_declarations(cls):
    assert struct_problems(source(), cls) == []


def test_functions_match_the_cpp_signatures():
    assert function_problems(source()) == []


def test_the_parser_reads_what_it_checks():
    src = source()
    assert [f[0] for f in c_struct(src, "Seg")][:6] == ["kkind", "vkind", "body", "unused", "k0", "k1"]
    assert c_struct(src, "Product")[2] == ("part", "Part", False, (3,))
    assert c_layout(src, "Seg")[1] == 32 * 8 and c_layout(src, "FfnPlan")[0]["wo"] == 7 * 8
    assert ("AK4", 8) in c_enum(src, "Kind") and c_functions(src)["tk_attn"] == ("int", [("AttnArgs", True)])


def _sub(src: str, a: str, b: str) -> str:
    assert src.count(a) == 1, a
    return src.replace(a, b)


def _swap(src: str, a: str, b: str) -> str:
    assert src.count(a) == 1 and src.count(b) == 1, (a, b)
    return src.replace(a, "\0").replace(b, a).replace("\0", b)


def test_a_change_on_the_cpp_side_only_is_caught():
    src = source()
    seg = "  int64_t kkind, vkind, body, unused;"
    assert struct_problems(_sub(src, seg, "  int64_t vkind, kkind, body, unused;"), abi.Seg)  # reordered
    assert struct_problems(_sub(src, seg, seg + "\n  int64_t extra;"), abi.Seg)  # added
    assert struct_problems(_sub(src, seg, "  int64_t kkind, vkind, body;"), abi.Seg)  # dropped
    assert struct_problems(_sub(src, "  int64_t kh0, kt0, kh1, kt1;", "  int32_t kh0, kt0, kh1, kt1;"), abi.Seg)
    assert struct_problems(_swap(src, "  float scale;", "  int32_t nth;"), abi.AttnArgs)
    assert struct_problems(_sub(src, "  Part part[3];", "  Part part[4];"), abi.Product)
    assert struct_problems(_sub(src, "  int64_t type;", "  int32_t type;"), abi.FfnPlan)  # inside a member struct
    assert kind_problems(_swap(src, "AV4 = 11", "AB4 = 14"))  # renumbered
    assert kind_problems(_sub(_sub(src, "AB2 = 16,", "AB2 = 16, AB1 = 17,"), "NKINDS = 17", "NKINDS = 18"))  # added
    assert type_problems(_swap(src, "CALL(Q4_1)", "CALL(Q5_0)"))
    assert type_problems(_sub(src, "NTYPES = 25", "NTYPES = 26"))
    assert function_problems(_sub(src, "int64_t ff, int act, float *out)", "int ff, int act, float *out)"))
    assert function_problems(_sub(src, "int64_t ff, int act, float *out)", "int64_t ff, int act)"))
    assert function_problems(_sub(src, 'extern "C" int tk_simd()', 'extern "C" int tk_simd2()'))


def test_a_change_on_the_python_side_only_is_caught():
    src = source()

    def variant(cls, fields):
        return type(cls.__name__, (ctypes.Structure,), {"_fields_": fields})

    f = list(abi.Seg._fields_)
    assert struct_problems(src, variant(abi.Seg, [f[1], f[0], *f[2:]]))  # reordered
    assert struct_problems(src, variant(abi.Seg, [*f, ("extra", ctypes.c_int64)]))  # added
    assert struct_problems(src, variant(abi.Seg, f[:-1]))  # dropped
    assert struct_problems(src, variant(abi.Seg, [*f[:-1], ("vd3", ctypes.c_int32)]))  # retyped
    a = list(abi.AttnArgs._fields_)
    assert struct_problems(src, variant(abi.AttnArgs, [*a[:-2], a[-1], a[-2]]))
    extended = enum.IntEnum("Kind", [(m.name, m.value) for m in abi.Kind] + [("AB1", 17)])  # one more member
    assert kind_problems(src, extended, 18) and kind_problems(src, abi.Kind, 18)
    renumbered = enum.IntEnum("Kind", [(m.name, m.value if m < 11 else 27 - m.value) for m in abi.Kind])
    assert kind_problems(src, renumbered)
    assert type_problems(src, abi.BLOCK_TYPES[:-1]) and type_problems(src, (*abi.BLOCK_TYPES, "Q8_K"))
    fns = dict(abi.FUNCTIONS)
    fns["tk_gemv"] = (fns["tk_gemv"][0], fns["tk_gemv"][1][:-1])
    assert function_problems(src, fns)
    fns = dict(abi.FUNCTIONS, tk_attn=(ctypes.c_int, [ctypes.POINTER(abi.Seg)]))
    assert function_problems(src, fns)


def test_sublayer_plans_are_packed_as_the_structs_lay_them_out():
    """`sublayers` builds its plans as the `abi` structs, with the fields the kernels read."""
    import torch

    from tightkv.kernels import qmatmul as qm
    from tightkv.kernels import sublayers

    def linear(n, k, seed):
        g = torch.Generator().manual_seed(seed)
        raw = torch.randint(0, 256, (n, k // 32 * 34), dtype=torch.uint8, generator=g)
        raw.view(n, k // 32, 34)[..., :2] = torch.tensor([0, 0x3C], dtype=torch.uint8)  # d = 1.0 (fp16)
        return qm.QuantLinear(raw, "Q8_0", k, n)

    def product(lin):
        parts = getattr(lin, "parts", [lin])
        return abi.Product(len(parts), lin.nbytes, tuple(p.kernel_part() for p in parts))

    d, ff, width = 64, 96, 128
    wo, down = linear(d, width, 1), linear(d, ff, 2)
    gate_up = qm.StackedLinear([linear(ff, d, 3), linear(ff, d, 4)])
    norms = [torch.ones(d), None, torch.full((d,), 2.0)]
    mlp = types.SimpleNamespace(gate_up=gate_up, down=down)
    plan = sublayers.FfnPlan(wo, mlp, *norms, "gelu")
    ptrs = [0 if t is None else t.data_ptr() for t in norms]
    want = abi.FfnPlan(d, ff, sublayers.ACT_IDS["gelu"], width, *ptrs, product(wo), product(gate_up), product(down))
    assert bytes(plan.plan) == bytes(want)

    wqkv = qm.StackedLinear([linear(4 * 16, d, 5), linear(16, d, 6), linear(16, d, 7)])
    bias = torch.zeros(6 * 16)
    qkv = sublayers.QkvPlan(wqkv, 4, 1, 16, bias=bias)
    assert bytes(qkv.plan) == bytes(abi.QkvPlan(4, 1, 16, d, bias.data_ptr(), 0, 0, product(wqkv)))
