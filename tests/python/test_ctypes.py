#!/usr/bin/env python3
"""libdsqwen through ctypes (standard library only): load the tiny golden
model on the CPU backend, prefill the golden prompt, decode the golden
tokens, and compare every row of logits with the Hugging Face reference
(max|a-b|/max|ref| <= 1e-4 and the same argmax).

    python3 test_ctypes.py <path to libdsqwen.so> <tests/data dir>

Exits 0 when everything matches, 1 otherwise (missing data included).
"""
import array
import ctypes as C
import json
import os
import sys

TOL = 1e-4
DSQ_BACKEND_CPU = 1
DSQ_KV_STATIC, DSQ_KV_PAGED = 0, 1
DSQ_KV_F32 = 2
DSQ_LOGITS_ALL = 1


class ModelParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("backend", C.c_int32), ("device", C.c_int32),
                ("n_threads", C.c_int32), ("load_tokenizer", C.c_int32)]


class CtxParams(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("max_seqs", C.c_int32), ("max_context", C.c_int32),
                ("max_batch_tokens", C.c_int32), ("kv_layout", C.c_int32), ("kv_dtype", C.c_int32),
                ("kv_block_size", C.c_int32), ("kv_pool_tokens", C.c_int64),
                ("kv_budget_bytes", C.c_int64), ("n_threads", C.c_int32)]


def bind(lib):
    P = C.POINTER
    sigs = {
        "dsq_version_string": (C.c_char_p, []),
        "dsq_status_string": (C.c_char_p, [C.c_int]),
        "dsq_last_error_message": (C.c_char_p, []),
        # the *_default_params() of the header are static inline (not in the
        # .so); an FFI fills its struct through the exported *_params_init()
        "dsq_model_params_init": (C.c_int, [P(ModelParams), C.c_uint32]),
        "dsq_ctx_params_init": (C.c_int, [P(CtxParams), C.c_uint32]),
        "dsq_model_load": (C.c_int, [C.c_char_p, P(ModelParams), P(C.c_void_p)]),
        "dsq_model_free": (None, [C.c_void_p]),
        "dsq_ctx_new": (C.c_int, [C.c_void_p, P(CtxParams), P(C.c_void_p)]),
        "dsq_ctx_free": (None, [C.c_void_p]),
        "dsq_ctx_last_error": (C.c_char_p, [C.c_void_p]),
        "dsq_prefill": (C.c_int, [C.c_void_p, C.c_int32, P(C.c_int32), C.c_int32, C.c_uint32,
                                  P(C.c_float)]),
        "dsq_decode_step": (C.c_int, [C.c_void_p, C.c_int32, P(C.c_int32), P(C.c_int32),
                                      P(C.c_float)]),
        "dsq_seq_length": (C.c_int, [C.c_void_p, C.c_int32, P(C.c_int32)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def check(lib, st, what, ctx=None):
    if st != 0:
        msg = lib.dsq_ctx_last_error(ctx) if ctx else lib.dsq_last_error_message()
        raise RuntimeError("%s: %s: %s" % (what, lib.dsq_status_string(st).decode(), msg.decode()))


def default_params(lib, cls, init, what):
    """A params struct at the library's defaults, its struct_size = sizeof."""
    p = cls()
    check(lib, init(C.byref(p), C.sizeof(cls)), what)
    if p.struct_size != C.sizeof(cls):
        raise RuntimeError("%s set struct_size %d, expected %d" % (what, p.struct_size, C.sizeof(cls)))
    return p


def read_f32(path, n):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) != n:
        raise RuntimeError("%s holds %d floats, expected %d" % (path, len(a), n))
    return a


def compare(got, ref, rows, vocab):
    """max|a-b|/max|ref| over all rows, and the rows whose argmax differs."""
    md = mr = 0.0
    bad = []
    for r in range(rows):
        a = got[r * vocab:(r + 1) * vocab]
        b = ref[r * vocab:(r + 1) * vocab]
        for x, y in zip(a, b):
            d = abs(x - y)
            if d != d:  # NaN
                d = float("inf")
            md = max(md, d)
            mr = max(mr, abs(y))
        if max(range(vocab), key=a.__getitem__) != max(range(vocab), key=b.__getitem__):
            bad.append(r)
    return (md / mr if mr > 0 else md), bad


def run(lib, data, layout):
    d = os.path.join(data, "tiny")
    with open(os.path.join(d, "golden.json")) as f:
        g = json.load(f)
    V, prompt, dec = g["vocab"], g["prompt"], g["decode_tokens"]
    pre_ref = read_f32(os.path.join(d, g["prefill_logits"]), len(prompt) * V)
    dec_ref = read_f32(os.path.join(d, g["decode_logits"]), len(dec) * V)

    mp = default_params(lib, ModelParams, lib.dsq_model_params_init, "dsq_model_params_init")
    mp.backend = DSQ_BACKEND_CPU
    model = C.c_void_p()
    check(lib, lib.dsq_model_load(d.encode(), C.byref(mp), C.byref(model)), "dsq_model_load")
    ctx = C.c_void_p()
    try:
        cp = default_params(lib, CtxParams, lib.dsq_ctx_params_init, "dsq_ctx_params_init")
        cp.max_seqs, cp.max_context, cp.max_batch_tokens = 2, 256, 32
        cp.kv_layout, cp.kv_dtype, cp.kv_block_size = layout, DSQ_KV_F32, 16
        check(lib, lib.dsq_ctx_new(model, C.byref(cp), C.byref(ctx)), "dsq_ctx_new")
        n = len(prompt)
        toks = (C.c_int32 * n)(*prompt)
        pre = (C.c_float * (n * V))(*([float("nan")] * (n * V)))
        check(lib, lib.dsq_prefill(ctx, 1, toks, n, DSQ_LOGITS_ALL, pre), "dsq_prefill", ctx)
        out = (C.c_float * (len(dec) * V))()
        seq = (C.c_int32 * 1)(1)
        row = (C.c_float * V)()
        for i, t in enumerate(dec):
            tok = (C.c_int32 * 1)(t)
            check(lib, lib.dsq_decode_step(ctx, 1, seq, tok, row), "dsq_decode_step", ctx)
            C.memmove(C.addressof(out) + i * V * 4, row, V * 4)
        length = C.c_int32(-1)
        check(lib, lib.dsq_seq_length(ctx, 1, C.byref(length)), "dsq_seq_length", ctx)
        if length.value != n + len(dec):
            raise RuntimeError("sequence length %d, expected %d" % (length.value, n + len(dec)))
        # a refused call must report through the context
        bad = (C.c_int32 * 1)(-1)
        st = lib.dsq_decode_step(ctx, 1, seq, bad, row)
        if st != -11 or not lib.dsq_ctx_last_error(ctx):
            raise RuntimeError("token -1 gave status %d, expected DSQ_ERR_TOKEN (-11)" % st)
        e1, b1 = compare(pre, pre_ref, n, V)
        e2, b2 = compare(out, dec_ref, len(dec), V)
    finally:
        lib.dsq_ctx_free(ctx)
        lib.dsq_model_free(model)
    name = "paged" if layout == DSQ_KV_PAGED else "static"
    print("%s KV F32: prefill %d rows rel err %.3e argmax mismatches %d; decode %d steps rel err %.3e "
          "argmax mismatches %d" % (name, n, e1, len(b1), len(dec), e2, len(b2)))
    return e1 <= TOL and e2 <= TOL and not b1 and not b2


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    lib = C.CDLL(sys.argv[1])
    bind(lib)
    print("libdsqwen", lib.dsq_version_string().decode())
    ok = True
    for layout in (DSQ_KV_STATIC, DSQ_KV_PAGED):
        try:
            ok = run(lib, sys.argv[2], layout) and ok
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            print("FAIL:", e)
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
