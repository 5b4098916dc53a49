"""The cffi declarations shipped in the package (dsqwen_cdef.h) are current
with include/dsqwen.h, parse with cffi, cover every exported function, and
agree with the package's ctypes signatures and struct layouts."""
import ctypes
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

cffi = pytest.importorskip("cffi")
HEADER = os.path.join(ROOT, "include", "dsqwen.h")


def header_functions():
    text = open(HEADER, encoding="utf-8").read()
    return sorted(set(re.findall(r"DSQ_API[^(;#]*?\b(dsq_[a-z0-9_]+)\(", text)))


def test_cdef_is_current_with_the_header(dsqwen):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_cdef.py"), HEADER,
                        "--check", dsqwen.cdef_path()], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def ffi_lib(dsqwen):
    ffi = cffi.FFI()
    ffi.cdef(dsqwen.cdef())
    return ffi, ffi.dlopen(dsqwen.library_path())


def test_cffi_calls_the_library(ffi_lib, dsqwen):
    ffi, lib = ffi_lib
    assert ffi.string(lib.dsq_version_string()).decode() == dsqwen.version()
    p = ffi.new("dsq_model_params *")
    assert lib.dsq_model_params_init(p, ffi.sizeof("dsq_model_params")) == lib.DSQ_OK
    assert p.backend == lib.DSQ_BACKEND_AUTO
    out = ffi.new("dsq_model **")
    assert lib.dsq_model_load(b"/no/such/dir", p, out) == lib.DSQ_ERR_IO
    assert out[0] == ffi.NULL and b"/no/such/dir" in ffi.string(lib.dsq_last_error_message())


def test_every_exported_function_is_declared(ffi_lib, dsqwen):
    ffi, lib = ffi_lib
    names = header_functions()
    assert len(names) > 40
    for n in names:
        assert ffi.typeof(getattr(lib, n)).kind == "function", n
    # and the ctypes layer declares each with the same signature
    from dsqwen import _capi
    assert sorted(_capi._SIGNATURES) == names


def _kind_ctypes(t):
    if t is None:
        return ("void",)
    if t in (ctypes.c_char_p, ctypes.c_void_p) or hasattr(t, "_type_") and \
            isinstance(t._type_, type) or getattr(t, "_flags_", 0) & 1:  # POINTER / CFUNCTYPE
        return ("ptr",)
    if t is ctypes.c_float:
        return ("float", 4)
    signed = t(-1).value == -1
    return ("int", ctypes.sizeof(t), signed)


def _kind_cffi(ffi, t):
    if t.kind in ("pointer", "function"):
        return ("ptr",)
    if t.kind == "void" or t.cname == "void":
        return ("void",)
    if t.cname == "float":
        return ("float", 4)
    size = ffi.sizeof(t)
    if t.kind == "enum":  # C leaves an enum's signedness to the compiler; ctypes says c_int
        return ("int", size, True)
    signed = int(ffi.cast(t, -1)) < 0
    return ("int", size, signed)


def test_ctypes_signatures_match_the_header(ffi_lib):
    ffi, lib = ffi_lib
    from dsqwen import _capi
    for name, (res, args) in _capi._SIGNATURES.items():
        ft = ffi.typeof(getattr(lib, name))
        assert _kind_ctypes(res) == _kind_cffi(ffi, ft.result), name
        assert len(args) == len(ft.args), name
        for i, (a, b) in enumerate(zip(args, ft.args)):
            assert _kind_ctypes(a) == _kind_cffi(ffi, b), "%s argument %d" % (name, i)
            if b.kind == "pointer" and b.item.kind == "struct" and b.item.fields is not None:
                assert ctypes.sizeof(a._type_) == ffi.sizeof(b.item), "%s argument %d" % (name, i)


@pytest.mark.parametrize("cls,cname", [("ModelParams", "dsq_model_params"),
                                       ("ModelInfo", "dsq_model_info"),
                                       ("CtxParams", "dsq_ctx_params"),
                                       ("CtxInfo", "dsq_ctx_info"),
                                       ("SamplerParams", "dsq_sampler_params"),
                                       ("ChatMessage", "dsq_chat_message"),
                                       ("SampleParams", "dsq_sample_params"),
                                       ("_capi.StepParams", "dsq_step_params"),
                                       ("_capi.StepSeq", "dsq_step_seq"),
                                       ("_capi.StepOut", "dsq_step_out")])
def test_struct_layouts_match(ffi_lib, dsqwen, cls, cname):
    ffi, _ = ffi_lib
    ct = getattr(dsqwen._capi, cls[6:]) if cls.startswith("_capi.") else getattr(dsqwen, cls)
    assert ctypes.sizeof(ct) == ffi.sizeof(cname)
    fields = ffi.typeof(cname).fields
    assert [f[0] for f in ct._fields_] == [f[0] for f in fields]
    for (name, _), (_, ff) in zip(ct._fields_, fields):
        assert getattr(ct, name).offset == ff.offset, "%s.%s" % (cname, name)
