"""dsqwen._capi - the ctypes layer over libdsqwen (standard library only).

It mirrors include/dsqwen.h: the params/info structs with their leading
struct_size, the enums as IntEnums, every function with its exact C
signature (tests/python checks them against the cffi declarations generated
from the header).  On top of it sit small classes (Model, Context,
Tokenizer, DetokStream, Sampler, Stopper) that own one handle each, free it
in close() and work as context managers.  A failing call raises DsqError
carrying the status, its dsq_status_string() and the
dsq_last_error_message() of that call.

Which libdsqwen.so is loaded: load_library(path) if called before anything
else, else the DSQWEN_LIBRARY environment variable, else the copy inside this
package, else the lib directories of the install prefix, else the system
search (libdsqwen.so.0 through LD_LIBRARY_PATH and the ld.so cache).
"""
import collections
import ctypes as C
import enum
import os
import sys
import sysconfig
import weakref

__all__ = ["DsqError", "Status", "Backend", "KvLayout", "KvDtype", "Quantize", "Role", "LogLevel",
           "build_features", "backend_available", "has_step", "SampleParams", "StepResult",
           "Model", "Context", "Tokenizer", "DetokStream", "Sampler", "Stopper",
           "load_library", "library_path", "version", "chat_format", "set_log_callback",
           "argmax"]

# --------------------------------------------------------------------------
# Enumerations and flags (values fixed by dsqwen.h)
# --------------------------------------------------------------------------


class Status(enum.IntEnum):
    OK = 0
    ERR_INVALID_ARG = -1
    ERR_STRUCT_SIZE = -2
    ERR_OUT_OF_MEMORY = -3
    ERR_IO = -4
    ERR_FORMAT = -5
    ERR_CONFIG = -6
    ERR_UNSUPPORTED = -7
    ERR_MISSING_TENSOR = -8
    ERR_SHAPE = -9
    ERR_DTYPE = -10
    ERR_TOKEN = -11
    ERR_SEQ = -12
    ERR_CONTEXT_FULL = -13
    ERR_KV_FULL = -14
    ERR_BATCH = -15
    ERR_BUFFER_TOO_SMALL = -16
    ERR_NO_DEVICE = -17
    ERR_DEVICE_OOM = -18
    ERR_DEVICE = -19
    ERR_INTERNAL = -20
    ERR_CANCELLED = -21


class LogLevel(enum.IntEnum):
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


class Backend(enum.IntEnum):
    AUTO = 0
    CPU = 1
    CUDA = 2


class KvLayout(enum.IntEnum):
    STATIC = 0
    PAGED = 1


class KvDtype(enum.IntEnum):
    F16 = 0
    INT8 = 1
    F32 = 2


class Quantize(enum.IntEnum):
    NONE = 0
    INT8 = 1
    Q4 = 2


TP_ID_BYTES = 128


class Role(enum.IntEnum):
    SYSTEM = 0
    USER = 1
    ASSISTANT = 2


LOGITS_LAST = 0
LOGITS_ALL = 1
TOKENIZE_ADD_SPECIAL = 1
TOKENIZE_PLAIN_SPECIAL = 2
STEP_LOGITS = 1
STEP_LOGPROB = 2
STEP_MAX_TOP_N = 20
PENALTY_MAX_N = 4096

# --------------------------------------------------------------------------
# Structs: field for field as in dsqwen.h (ctypes applies the C alignment)
# --------------------------------------------------------------------------

_i32, _u32, _i64, _u64, _f32 = C.c_int32, C.c_uint32, C.c_int64, C.c_uint64, C.c_float


# dsq_progress_fn: int (*)(float fraction, void *user)
ProgressFn = C.CFUNCTYPE(C.c_int, C.c_float, C.c_void_p)


class ModelParams(C.Structure):
    _fields_ = [("struct_size", _u32), ("backend", _i32), ("device", _i32),
                ("n_threads", _i32), ("load_tokenizer", _i32),
                # appended after 0.1.0
                ("skip_finite_check", _i32), ("copy_weights", _i32),
                ("progress", ProgressFn), ("progress_user", C.c_void_p),
                # appended in 0.2.0
                ("quantize", _i32), ("quantize_head", _i32),
                ("tp_world", _i32), ("tp_devices", C.POINTER(_i32)), ("tp_rank", _i32),
                ("tp_id", C.c_void_p), ("tp_timeout_s", _f32)]


class ModelInfo(C.Structure):
    _fields_ = [("struct_size", _u32), ("backend", _i32), ("n_vocab", _i32), ("n_embd", _i32),
                ("n_layers", _i32), ("n_heads", _i32), ("n_kv_heads", _i32),
                ("head_dim", _i32), ("n_ff", _i32), ("max_context", _i32),
                ("tie_embeddings", _i32), ("rope_theta", _f32), ("rms_norm_eps", _f32),
                ("n_params", _i64), ("weight_bytes", _i64), ("device_bytes", _i64),
                ("bos_token", _i32), ("eos_token", _i32)]


class CtxParams(C.Structure):
    _fields_ = [("struct_size", _u32), ("max_seqs", _i32), ("max_context", _i32),
                ("max_batch_tokens", _i32), ("kv_layout", _i32), ("kv_dtype", _i32),
                ("kv_block_size", _i32), ("kv_pool_tokens", _i64),
                ("kv_budget_bytes", _i64), ("n_threads", _i32)]


class CtxInfo(C.Structure):
    _fields_ = [("struct_size", _u32), ("backend", _i32), ("kv_layout", _i32),
                ("kv_dtype", _i32), ("max_seqs", _i32), ("max_context", _i32),
                ("max_batch_tokens", _i32), ("kv_block_size", _i32),
                ("kv_bytes_per_token", _i64), ("kv_capacity_tokens", _i64),
                ("kv_free_tokens", _i64), ("kv_bytes", _i64), ("scratch_bytes", _i64),
                ("n_threads", _i32), ("n_active_seqs", _i32)]


class SamplerParams(C.Structure):
    _fields_ = [("struct_size", _u32), ("temperature", _f32), ("top_k", _i32),
                ("top_p", _f32), ("min_p", _f32), ("repetition_penalty", _f32),
                ("penalty_last_n", _i32), ("seed", _u64), ("n_vocab_valid", _i32)]


class SampleParams(C.Structure):
    """dsq_sample_params: how dsq_step() samples one sequence."""
    _fields_ = [("struct_size", _u32), ("temperature", _f32), ("top_k", _i32),
                ("top_p", _f32), ("min_p", _f32), ("repetition_penalty", _f32),
                ("presence_penalty", _f32), ("frequency_penalty", _f32),
                ("penalty_last_n", _i32), ("seed", _u64), ("n_vocab_valid", _i32)]


class StepSeq(C.Structure):
    """dsq_step_seq: one entry of a dsq_step() batch (fixed layout)."""
    _fields_ = [("seq", _i32), ("n_tokens", _i32), ("tokens", C.POINTER(_i32)),
                ("sample", C.POINTER(SampleParams)), ("top_n", _i32), ("flags", _u32)]


class StepOut(C.Structure):
    """dsq_step_out: what dsq_step() returns for one entry."""
    _fields_ = [("token", _i32), ("logprob", _f32), ("n_top", _i32),
                ("top_ids", _i32 * STEP_MAX_TOP_N), ("top_logprobs", _f32 * STEP_MAX_TOP_N)]


class StepParams(C.Structure):
    """dsq_step_params: where dsq_step() writes logits."""
    _fields_ = [("struct_size", _u32), ("logits", C.POINTER(_f32)),
                ("logits_on_device", _i32)]


class ChatMessage(C.Structure):
    _fields_ = [("role", _i32), ("content", C.c_char_p)]


LogFn = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)

# --------------------------------------------------------------------------
# Loading the library and declaring every function
# --------------------------------------------------------------------------

_P, _vp, _st, _sz = C.POINTER, C.c_void_p, C.c_int, C.c_size_t
_SIGNATURES = {
    # name: (restype, argtypes); _st marks a dsq_status return
    "dsq_version_string": (C.c_char_p, []),
    "dsq_version_number": (C.c_uint, []),
    "dsq_build_features": (C.c_char_p, []),
    "dsq_backend_available": (C.c_int, [C.c_int]),
    "dsq_status_string": (C.c_char_p, [_st]),
    "dsq_last_error_message": (C.c_char_p, []),
    "dsq_set_log_callback": (None, [LogFn, _vp, C.c_int]),
    # *_default_params() are static inline in dsqwen.h (not exported): an FFI
    # fills its params struct with *_params_init(p, sizeof *p) instead
    "dsq_model_params_init": (_st, [_P(ModelParams), _u32]),
    "dsq_model_load": (_st, [C.c_char_p, _P(ModelParams), _P(_vp)]),
    "dsq_model_free": (None, [_vp]),
    "dsq_model_get_info": (_st, [_vp, _P(ModelInfo)]),
    "dsq_model_save": (_st, [_vp, C.c_char_p]),
    "dsq_ctx_params_init": (_st, [_P(CtxParams), _u32]),
    "dsq_ctx_new": (_st, [_vp, _P(CtxParams), _P(_vp)]),
    "dsq_ctx_free": (None, [_vp]),
    "dsq_ctx_last_error": (C.c_char_p, [_vp]),
    "dsq_ctx_get_info": (_st, [_vp, _P(CtxInfo)]),
    "dsq_ctx_synchronize": (_st, [_vp]),
    "dsq_tp_unique_id": (_st, [_vp, _sz]),
    "dsq_ctx_cuda_stream": (_st, [_vp, _P(_vp)]),
    "dsq_prefill": (_st, [_vp, _i32, _P(_i32), _i32, _u32, _P(_f32)]),
    "dsq_decode_step": (_st, [_vp, _i32, _P(_i32), _P(_i32), _P(_f32)]),
    "dsq_seq_remove": (_st, [_vp, _i32]),
    "dsq_seq_length": (_st, [_vp, _i32, _P(_i32)]),
    "dsq_seq_truncate": (_st, [_vp, _i32, _i32]),
    "dsq_seq_fork": (_st, [_vp, _i32, _i32]),
    "dsq_sample_params_init": (_st, [_P(SampleParams), _u32]),
    "dsq_step_params_init": (_st, [_P(StepParams), _u32]),
    "dsq_step": (_st, [_vp, _P(StepSeq), _i32, _P(StepParams), _P(StepOut)]),
    "dsq_tokenizer_load": (_st, [C.c_char_p, _P(_vp)]),
    "dsq_tokenizer_free": (None, [_vp]),
    "dsq_model_tokenizer": (_vp, [_vp]),
    "dsq_tokenize": (_st, [_vp, C.c_char_p, _sz, _u32, _P(_i32), _sz, _P(_sz)]),
    "dsq_detokenize": (_st, [_vp, _P(_i32), _sz, C.c_int, C.c_char_p, _sz, _P(_sz)]),
    "dsq_tokenizer_n_tokens": (_i32, [_vp]),
    "dsq_tokenizer_token_id": (_i32, [_vp, C.c_char_p]),
    "dsq_token_text": (C.c_char_p, [_vp, _i32]),
    "dsq_token_is_special": (C.c_int, [_vp, _i32]),
    "dsq_tokenizer_bos": (_i32, [_vp]),
    "dsq_tokenizer_eos": (_i32, [_vp]),
    "dsq_detok_stream_new": (_st, [_vp, C.c_int, _P(_vp)]),
    "dsq_detok_stream_free": (None, [_vp]),
    "dsq_detok_stream_push": (_st, [_vp, _i32, C.c_char_p, _sz, _P(_sz)]),
    "dsq_detok_stream_flush": (_st, [_vp, C.c_char_p, _sz, _P(_sz)]),
    "dsq_chat_format": (_st, [_P(ChatMessage), _sz, C.c_int, C.c_char_p, _sz, _P(_sz)]),
    "dsq_sampler_params_init": (_st, [_P(SamplerParams), _u32]),
    "dsq_sampler_new": (_st, [_P(SamplerParams), _P(_vp)]),
    "dsq_sampler_free": (None, [_vp]),
    "dsq_sampler_sample": (_st, [_vp, _P(_f32), _i32, _P(_i32)]),
    "dsq_sampler_accept": (_st, [_vp, _P(_i32), _sz]),
    "dsq_sampler_reset": (None, [_vp, _u64]),
    "dsq_model_sampler_params": (_st, [_vp, _P(SamplerParams)]),
    "dsq_stopper_new": (_st, [_vp, _P(C.c_char_p), _sz, C.c_int, _P(_vp)]),
    "dsq_stopper_free": (None, [_vp]),
    "dsq_stopper_push": (_st, [_vp, _i32, C.c_char_p, _sz, _P(_sz), _P(C.c_int)]),
    "dsq_stopper_flush": (_st, [_vp, C.c_char_p, _sz, _P(_sz)]),
    "dsq_stopper_reset": (None, [_vp]),
}

# Added in 0.1.x: a libdsqwen.so.0 without them (DSQWEN_LIBRARY pointing at an
# older build) still loads; has_step() says whether they are there, and the
# calls that need them raise NotImplementedError.
_STEP_FUNCS = {"dsq_seq_truncate", "dsq_seq_fork", "dsq_sample_params_init",
               "dsq_step_params_init", "dsq_step"}
_OPTIONAL = _STEP_FUNCS | {"dsq_ctx_synchronize", "dsq_ctx_cuda_stream", "dsq_tp_unique_id",
                            "dsq_model_save"}

# The major version this module was written against (DSQ_VERSION_MAJOR).
_ABI_MAJOR = 0
_SONAME = "libdsqwen.so.%d" % _ABI_MAJOR
_lib = None
_lib_path = None


def _candidates():
    """(description, path) pairs in search order, after DSQWEN_LIBRARY."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = [("inside the package", os.path.join(here, _SONAME))]
    # the install prefix: sys.prefix (a venv or /usr/local), and the prefix
    # this package sits under (PREFIX/lib/pythonX.Y/site-packages/dsqwen)
    prefixes = [sys.prefix]
    up = here
    for _ in range(4):
        up = os.path.dirname(up)
    prefixes.append(up)
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for pre in dict.fromkeys(prefixes):
        for sub in ["lib", "lib64"] + (["lib/" + multiarch] if multiarch else []):
            out.append(("in the install prefix", os.path.join(pre, sub, _SONAME)))
    return out


def load_library(path=None):
    """Load libdsqwen (see the module docstring for the search order) and
    declare its functions.  Called implicitly on first use; returns the
    ctypes.CDLL.  Raises OSError listing every place looked at when no
    library loads, or if its major version differs from these bindings'."""
    global _lib, _lib_path
    if _lib is not None and path is None:
        return _lib
    tried = []
    if path is None and os.environ.get("DSQWEN_LIBRARY"):
        path = os.environ["DSQWEN_LIBRARY"]  # an override: nothing else is tried
    attempts = [("given", path)] if path else \
        [(d, p) for d, p in _candidates() if os.path.exists(p)] + [("system loader", _SONAME)]
    lib = None
    for what, p in attempts:
        try:
            lib = C.CDLL(p)
            path = p
            break
        except OSError as e:
            tried.append("%s: %s" % (p, e))
    if lib is None:
        looked = [p for _, p in _candidates()]
        raise OSError("libdsqwen not found.  Tried: %s.  Looked for %s in: %s; then the system "
                      "loader (LD_LIBRARY_PATH, ld.so cache).  Set DSQWEN_LIBRARY to the "
                      "library's path, or install libdsqwen (see README)."
                      % ("; ".join(tried) or "nothing loadable", _SONAME, ", ".join(looked)))
    for name, (res, args) in _SIGNATURES.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            if name in _OPTIONAL:
                continue
            raise
        f.restype, f.argtypes = res, args
    if lib.dsq_version_number() // 10000 != _ABI_MAJOR:
        raise OSError("%s is libdsqwen %s; these bindings need major version %d"
                      % (path, lib.dsq_version_string().decode(), _ABI_MAJOR))
    _lib, _lib_path = lib, path
    return lib


def library_path():
    """Path (or soname) of the libdsqwen that was loaded."""
    load_library()
    return _lib_path


def _L():
    return _lib if _lib is not None else load_library()


def has_step():
    """True if the loaded library has dsq_step, dsq_seq_fork and
    dsq_seq_truncate (Context.step/fork/truncate; Model.generate then
    samples inside the library, on the GPU with the CUDA backend)."""
    return all(hasattr(_L(), n) for n in _STEP_FUNCS)


def _need(name):
    if not hasattr(_L(), name):
        raise NotImplementedError("%s is not in %s (an older libdsqwen)" % (name, library_path()))


def _need_step(what):
    if not has_step():
        raise NotImplementedError("%s needs a libdsqwen with dsq_step (%s is older)"
                                  % (what, library_path()))


class DsqError(Exception):
    """A libdsqwen call failed.  .status is a Status, .name its
    dsq_status_string() and .message the library's message for the call."""

    def __init__(self, status, message, what=""):
        try:
            self.status = Status(status)
        except ValueError:  # a code newer than these bindings
            self.status = status
        self.name = _L().dsq_status_string(status).decode()
        self.message = message
        super().__init__("%s%s%s" % (what + ": " if what else "", self.name,
                                     " (" + message + ")" if message else ""))


def _check(status, what):
    """Raise DsqError for a failing status.  Reads this thread's message at
    once: it is valid only until the next libdsqwen call on the thread."""
    if status != Status.OK:
        raise DsqError(status, _L().dsq_last_error_message().decode("utf-8", "replace"), what)


def version():
    """Version string of the loaded library, e.g. "0.1.0"."""
    return _L().dsq_version_string().decode()


def build_features():
    """What the loaded library was built with (dsq_build_features()): a
    space-separated str of words, "cpu" always, "cuda" when the CUDA backend
    is compiled in (whether a GPU is there is backend_available()'s
    question)."""
    return _L().dsq_build_features().decode()


def backend_available(backend):
    """True if `backend` (a Backend or "auto"/"cpu"/"cuda") can be used on
    this machine now.  CUDA: built in and a usable device found (the first
    call starts the CUDA runtime, which may take a second)."""
    if isinstance(backend, str):
        backend = Backend[backend.upper()]
    return bool(_L().dsq_backend_available(int(backend)))


def _ids(tokens):
    """A C int32 array from a sequence of ints (or one already)."""
    if isinstance(tokens, C.Array) and tokens._type_ is _i32:
        return tokens
    return (_i32 * len(tokens))(*tokens)


def argmax(row, start=0, n=None):
    """Index of the largest of row[start:start+n] relative to start (first on
    ties), for ctypes arrays or any sequence; numpy users call .argmax()."""
    n = len(row) - start if n is None else n
    best, best_v = 0, row[start]
    for i in range(1, n):
        v = row[start + i]
        if v > best_v:
            best, best_v = i, v
    return best


_log_keepalive = None  # the installed callback must outlive its C pointer


def set_log_callback(fn, max_level=LogLevel.WARN):
    """Route library diagnostics to fn(level: LogLevel, message: str); None
    removes the callback.  fn may be called from any thread in the library."""
    global _log_keepalive
    if fn is None:
        _L().dsq_set_log_callback(LogFn(), None, int(max_level))
        _log_keepalive = None
        return
    cb = LogFn(lambda lvl, msg, _user: fn(LogLevel(lvl), msg.decode("utf-8", "replace")))
    _L().dsq_set_log_callback(cb, None, int(max_level))
    _log_keepalive = cb


def chat_format(messages, add_generation_prompt=True):
    """Render [(Role, text), ...] in the R1-Distill chat format; returns str."""
    arr = (ChatMessage * len(messages))(
        *[ChatMessage(int(r), t.encode("utf-8")) for r, t in messages])
    n = _sz(0)
    st = _L().dsq_chat_format(arr, len(messages), int(add_generation_prompt), None, 0,
                              C.byref(n))
    if st != Status.ERR_BUFFER_TOO_SMALL:
        _check(st, "dsq_chat_format")
    buf = C.create_string_buffer(n.value + 1)
    _check(_L().dsq_chat_format(arr, len(messages), int(add_generation_prompt), buf,
                                len(buf), C.byref(n)), "dsq_chat_format")
    return buf.raw[:n.value].decode("utf-8")


def _params(cls, kwargs, what):
    """A `cls` params struct filled with the library's defaults by
    <what>_init(p, sizeof *p) (the *_default_params() of the header are
    static inline, so not callable from here), then keyword fields set on
    it; unknown names are errors rather than silently ignored."""
    p = cls()
    _check(getattr(_L(), what + "_init")(C.byref(p), C.sizeof(cls)), what + "_init")
    names = {f[0] for f in cls._fields_} - {"struct_size"}
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError("%s has no field %r" % (what, k))
        setattr(p, k, int(v) if isinstance(v, enum.IntEnum) else v)
    return p


def _numpy_view(arr, n_vocab, rows):
    """A numpy float32 view of a ctypes float array (numpy is optional: only
    this needs it)."""
    try:
        import numpy
    except ImportError as e:
        raise ImportError("numpy=True needs numpy (pip install numpy, or python3-numpy)") from e
    a = numpy.frombuffer(arr, dtype=numpy.float32)
    return a.reshape(-1, n_vocab) if rows else a


class _Handle:
    """One owned C handle; close() frees it once, and so does the context
    manager and (as a last resort) garbage collection."""
    _free = None

    def __init__(self, handle):
        self._h = handle

    @property
    def handle(self):
        if not self._h:
            raise ValueError("%s is closed" % type(self).__name__)
        return self._h

    def close(self):
        if self._h:
            h, self._h = self._h, None
            getattr(_L(), self._free)(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------
# Model and Context
# --------------------------------------------------------------------------


class _Progress:
    """The ctypes callback behind Model(progress=fn).  The library calls it
    synchronously inside dsq_model_load(), so this object (and the C
    function pointer it owns) lives on the Python stack for exactly that
    call.  An exception from fn must not cross the C frames: it is kept,
    the load is cancelled (nonzero return), and Model.__init__ raises it."""

    def __init__(self, fn):
        self.fn, self.error = fn, None
        self.c_fn = ProgressFn(self._call)

    def _call(self, fraction, _user):
        if self.error is not None:  # cancelled already; the library stops asking
            return 1
        try:
            return 1 if self.fn(fraction) is False else 0
        except BaseException as e:  # KeyboardInterrupt too: cancel, re-raise later
            self.error = e
            return 1


class Model(_Handle):
    """A loaded model (dsq_model_load).  Keyword arguments set fields of
    dsq_model_params: backend (Backend or "auto"/"cpu"/"cuda"), device,
    n_threads, load_tokenizer, skip_finite_check, copy_weights, quantize
    (Quantize or "none"/"int8"/"q4": quantize linear weights at load) and
    quantize_head (see dsq_model_params in dsqwen.h), and progress: a callable fn(fraction)
    called during the load with fractions in [0, 1], never decreasing,
    ending at 1.0; returning False cancels the load (DsqError with
    Status.ERR_CANCELLED), any other value continues, and an exception
    raised inside it cancels the load and propagates from Model().
    Closing the model first closes the contexts made from it."""
    _free = "dsq_model_free"

    def __init__(self, path, progress=None, **params):
        if isinstance(params.get("backend"), str):
            params["backend"] = Backend[params["backend"].upper()]
        if isinstance(params.get("quantize"), str):
            params["quantize"] = Quantize[params["quantize"].upper()]
        if "progress_user" in params:
            raise TypeError("progress_user is managed by Model(progress=fn)")
        for k in ("skip_finite_check", "copy_weights", "load_tokenizer", "quantize_head"):
            if k in params:
                params[k] = int(bool(params[k]))
        p = _params(ModelParams, params, "dsq_model_params")
        cb = None
        if progress is not None:
            if not callable(progress):
                raise TypeError("progress must be callable, got %r" % type(progress).__name__)
            cb = _Progress(progress)
            p.progress = cb.c_fn
        h = _vp()
        st = _L().dsq_model_load(os.fsencode(path), C.byref(p), C.byref(h))
        if cb is not None and cb.error is not None:
            # the library may have failed for its own reason after the cancel
            # was asked; the caller's exception is what they need to see
            err = DsqError(st, _L().dsq_last_error_message().decode("utf-8", "replace"),
                           "dsq_model_load(%s)" % path) if st != Status.OK else None
            if h.value:  # cancelled at 1.0, after the library finished: keep nothing
                _L().dsq_model_free(h.value)
            raise cb.error from err
        _check(st, "dsq_model_load(%s)" % path)
        super().__init__(h.value)
        self._contexts = weakref.WeakSet()
        info = ModelInfo(struct_size=C.sizeof(ModelInfo))
        _check(_L().dsq_model_get_info(self.handle, C.byref(info)), "dsq_model_get_info")
        self.info = info  # ModelInfo; fixed for the model's life
        t = _L().dsq_model_tokenizer(self.handle)
        self.tokenizer = Tokenizer(t, owner=self) if t else None

    def save(self, out_dir):
        """Write the weights as the model runs them (quantized ones in the
        library's own format) as a checkpoint in out_dir (dsq_model_save;
        CPU backend only)."""
        _check(_L().dsq_model_save(self.handle, os.fsencode(out_dir)),
               "dsq_model_save(%s)" % out_dir)

    def context(self, **params):
        """A new Context; keywords set dsq_ctx_params fields."""
        ctx = Context(self, **params)
        self._contexts.add(ctx)
        return ctx

    def close(self):
        for ctx in list(getattr(self, "_contexts", ())):
            ctx.close()
        super().close()

    @property
    def backend(self):
        """The backend that runs this model (Backend.CPU or Backend.CUDA)."""
        return Backend(self.info.backend)

    def _tok(self, tokenizer=None):
        tok = tokenizer if tokenizer is not None else self.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer.json: pass tokenizer=Tokenizer.load(path)"
                             " or token ids")
        return tok

    def tokenize(self, text, add_special=False):
        """Token ids of text with the model's tokenizer (see Tokenizer.encode)."""
        return self._tok().encode(text, add_special=add_special)

    def detokenize(self, tokens, skip_special=False):
        """Text of token ids with the model's tokenizer."""
        return self._tok().decode(tokens, skip_special=skip_special)

    def sampler_params(self, **overrides):
        """SamplerParams the model recommends (generation_config.json), with
        keyword fields overridden."""
        p = SamplerParams()
        _check(_L().dsq_sampler_params_init(C.byref(p), C.sizeof(p)), "dsq_sampler_params_init")
        _check(_L().dsq_model_sampler_params(self.handle, C.byref(p)), "dsq_model_sampler_params")
        names = {f[0] for f in SamplerParams._fields_} - {"struct_size"}
        for k, v in overrides.items():
            if k not in names:
                raise TypeError("dsq_sampler_params has no field %r" % k)
            if v is not None:
                setattr(p, k, v)
        return p

    def sample_params(self, **overrides):
        """SampleParams for Context.step(): the library defaults
        (dsq_sample_params_init) with the settings the model recommends
        (the fields dsq_model_sampler_params() fills: generation_config.json
        and the tokenizer's size), then keyword fields overridden
        (temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, penalty_last_n, seed,
        n_vocab_valid)."""
        _need_step("Model.sample_params")
        p = _params(SampleParams, {}, "dsq_sample_params")
        rec = self.sampler_params()
        names = {f[0] for f in SampleParams._fields_} - {"struct_size"}
        for k in names & {f[0] for f in SamplerParams._fields_}:
            setattr(p, k, getattr(rec, k))
        for k, v in overrides.items():
            if k not in names:
                raise TypeError("dsq_sample_params has no field %r" % k)
            if v is not None:
                setattr(p, k, v)
        return p

    def generate(self, prompt, max_tokens=256, stop=(), tokenizer=None, **sampling):
        """Stream the continuation of `prompt` as text pieces (an iterator of
        str).  prompt: str (tokenized with BOS as the model's tokenizer
        says) or a list of token ids.  Stops at EOS, at any string of `stop`
        (never shown) or after max_tokens.  Sampling keywords (temperature,
        top_k, top_p, min_p, repetition_penalty, seed) override the model's
        recommended settings; temperature=0 is greedy.  tokenizer: one to use
        when the model directory has none.  When the library has dsq_step
        (has_step()) the tokens are drawn inside the library (on the GPU with
        the CUDA backend, so no logits are copied to the host), and
        presence_penalty / frequency_penalty are accepted too;
        library_sampling=False draws them on the host with a Sampler
        instead (the two draw different random streams from the same seed;
        greedy picks the same ids)."""
        from . import _generate
        return _generate.text_stream(self, prompt, max_tokens, stop, tokenizer, sampling)

    def generate_ids(self, prompt_ids, max_tokens=256, stop_ids=None, **sampling):
        """Stream generated token ids (an iterator of int); no tokenizer needed.
        Stops after max_tokens, or at an id in stop_ids (default: the
        tokenizer's EOS when there is one), which is yielded last."""
        from . import _generate
        return _generate.id_stream(self, prompt_ids, max_tokens, stop_ids, sampling)

    def chat(self, messages, max_tokens=1024, stop=(), tokenizer=None, **sampling):
        """Stream the assistant's reply to a conversation as text pieces.
        messages: [(Role or "system"/"user"/"assistant", text)] or
        [{"role": ..., "content": ...}] in order.  The R1 format opens the
        reply with "<think>\n", so the reasoning comes first, then the answer."""
        msgs = []
        for m in messages:
            role, text = (m["role"], m["content"]) if isinstance(m, dict) else m
            if isinstance(role, str):
                role = Role[role.upper()]
            msgs.append((role, text))
        text = chat_format(msgs, add_generation_prompt=True)
        ids = self._tok(tokenizer).encode(text)
        return self.generate(ids, max_tokens, stop, tokenizer, **sampling)


class Context(_Handle):
    """KV cache and scratch for up to max_seqs sequences (dsq_ctx_new).  One
    thread at a time.  Holds a reference to its model."""
    _free = "dsq_ctx_free"

    def __init__(self, model, **params):
        p = _params(CtxParams, params, "dsq_ctx_params")
        h = _vp()
        _check(_L().dsq_ctx_new(model.handle, C.byref(p), C.byref(h)), "dsq_ctx_new")
        super().__init__(h.value)
        self.model = model
        self.n_vocab = model.info.n_vocab

    def info(self):
        """Current CtxInfo (free KV tokens and active sequences change)."""
        info = CtxInfo(struct_size=C.sizeof(CtxInfo))
        _check(_L().dsq_ctx_get_info(self.handle, C.byref(info)), "dsq_ctx_get_info")
        return info

    def synchronize(self):
        """Wait for the context's queued GPU work (dsq_ctx_synchronize): a
        no-op on the CPU backend."""
        _need("dsq_ctx_synchronize")
        _check(_L().dsq_ctx_synchronize(self.handle), "dsq_ctx_synchronize")

    @property
    def cuda_stream(self):
        """The context's cudaStream_t as an int (for CuPy/PyTorch external
        streams), or None on the CPU backend (dsq_ctx_cuda_stream)."""
        _need("dsq_ctx_cuda_stream")
        h = C.c_void_p()
        st = _L().dsq_ctx_cuda_stream(self.handle, C.byref(h))
        if st == Status.ERR_UNSUPPORTED:
            return None
        _check(st, "dsq_ctx_cuda_stream")
        return h.value

    def prefill(self, tokens, seq=0, logits="last", numpy=False):
        """Append tokens to sequence seq.  logits: "last" returns a ctypes
        float array [n_vocab], "all" one of [len(tokens) * n_vocab]
        (row-major), None computes no logits and returns None.  numpy=True
        returns a numpy float32 array instead ([n_vocab] or [n, n_vocab]),
        viewing the same memory."""
        ids = _ids(tokens)
        if logits is None:
            out, flags = None, LOGITS_LAST
        elif logits in ("last", "all"):
            flags = LOGITS_ALL if logits == "all" else LOGITS_LAST
            out = (_f32 * (self.n_vocab * (len(ids) if flags == LOGITS_ALL else 1)))()
        else:
            raise ValueError('logits must be "last", "all" or None')
        _check(_L().dsq_prefill(self.handle, seq, ids, len(ids), flags, out), "dsq_prefill")
        if numpy and out is not None:
            return _numpy_view(out, self.n_vocab, flags == LOGITS_ALL)
        return out

    def decode_step(self, seqs, tokens, logits=True, numpy=False):
        """Append tokens[i] to sequence seqs[i] for all i in one batch.
        Returns a ctypes float array [len(seqs) * n_vocab] (row i belongs to
        seqs[i]), with numpy=True a numpy array [len(seqs), n_vocab], or
        None when logits is False."""
        s, t = _ids(seqs), _ids(tokens)
        if len(s) != len(t):
            raise ValueError("seqs and tokens differ in length")
        out = (_f32 * (self.n_vocab * len(s)))() if logits else None
        _check(_L().dsq_decode_step(self.handle, len(s), s, t, out), "dsq_decode_step")
        if numpy and out is not None:
            return _numpy_view(out, self.n_vocab, True)
        return out

    def seq_length(self, seq=0):
        n = _i32()
        _check(_L().dsq_seq_length(self.handle, seq, C.byref(n)), "dsq_seq_length")
        return n.value

    def seq_remove(self, seq=0):
        _check(_L().dsq_seq_remove(self.handle, seq), "dsq_seq_remove")

    def truncate(self, seq, new_len):
        """Keep only the first new_len tokens of sequence seq
        (dsq_seq_truncate): regenerate from an earlier point."""
        _need_step("Context.truncate")
        _check(_L().dsq_seq_truncate(self.handle, seq, new_len), "dsq_seq_truncate")

    def fork(self, src, dst):
        """Start sequence dst as a copy of sequence src (dsq_seq_fork): a
        prefix prefilled once, then continued several ways.  dst must be
        empty."""
        _need_step("Context.fork")
        _check(_L().dsq_seq_fork(self.handle, src, dst), "dsq_seq_fork")

    def step(self, batch, numpy=False):
        """One dsq_step(): every entry of `batch` appends its tokens to its
        sequence in one forward pass (decode steps of 1 token beside prompt
        chunks), then the entries that ask are sampled inside the library
        (on the GPU with the CUDA backend).

        An entry is a dict with keys seq, tokens, and optionally sample (a
        SampleParams, e.g. Model.sample_params(...), or a dict of its
        fields; None samples nothing), top_n (0..STEP_MAX_TOP_N most likely
        ids with their log-probabilities; needs sample), logprob (the
        sampled id's log-probability; needs sample), logits (return the
        logits of its last token); or a tuple (seq, tokens[, sample]).

        Returns one StepResult per entry, in order: token (the sampled id;
        None when the entry sampled nothing or its logits held no finite
        value), logprob (float or None), top ([(id, logprob)], most likely
        first), logits (ctypes float array [n_vocab], with numpy=True a
        numpy array, or None).  Log-probabilities are the model's, before
        penalties and temperature."""
        _need_step("Context.step")
        entries = [_step_entry(e) for e in batch]
        n = len(entries)
        if n == 0:
            raise ValueError("the batch is empty")
        seqs = (StepSeq * n)()
        keep = []  # ctypes objects the C structs point into, alive for the call
        n_rows = 0
        for i, (seq, tokens, sample, top_n, logprob, logits) in enumerate(entries):
            ids = _ids(tokens)
            keep.append(ids)
            e = seqs[i]
            e.seq, e.n_tokens, e.top_n = seq, len(ids), top_n
            e.tokens = C.cast(ids, C.POINTER(_i32))
            if sample is not None:
                if isinstance(sample, dict):
                    sample = self.model.sample_params(**sample)
                elif not isinstance(sample, SampleParams):
                    raise TypeError("sample must be a SampleParams, a dict or None")
                keep.append(sample)
                e.sample = C.pointer(sample)
            e.flags = (STEP_LOGITS if logits else 0) | (STEP_LOGPROB if logprob else 0)
            n_rows += bool(logits)
        params = _params(StepParams, {}, "dsq_step_params")
        buf = None
        if n_rows:
            buf = (_f32 * (n_rows * self.n_vocab))()
            params.logits = C.cast(buf, C.POINTER(_f32))
        out = (StepOut * n)()
        _check(_L().dsq_step(self.handle, seqs, n, C.byref(params), out), "dsq_step")
        res, row = [], 0
        for i, (_, _, sample, _, logprob, logits) in enumerate(entries):
            o = out[i]
            tok = o.token if sample is not None and o.token >= 0 else None
            lp = o.logprob if logprob and tok is not None else None
            top = [(o.top_ids[j], o.top_logprobs[j]) for j in range(o.n_top)]
            lg = None
            if logits:
                lg = (_f32 * self.n_vocab).from_buffer(buf, row * self.n_vocab * 4)
                if numpy:
                    lg = _numpy_view(lg, self.n_vocab, False)
                row += 1
            res.append(StepResult(tok, lp, top, lg))
        return res

    def last_error(self):
        """dsq_ctx_last_error(): message of the last failing call here."""
        return _L().dsq_ctx_last_error(self.handle).decode("utf-8", "replace")


StepResult = collections.namedtuple("StepResult", "token logprob top logits")
StepResult.__doc__ = "What Context.step() returns for one entry (see there)."


def _step_entry(e):
    """(seq, tokens, sample, top_n, logprob, logits) of a Context.step entry."""
    if isinstance(e, dict):
        unknown = set(e) - {"seq", "tokens", "sample", "top_n", "logprob", "logits"}
        if unknown:
            raise TypeError("unknown step entry keys %s" % sorted(unknown))
        return (int(e["seq"]), e["tokens"], e.get("sample"), int(e.get("top_n", 0)),
                bool(e.get("logprob", False)), bool(e.get("logits", False)))
    if isinstance(e, tuple) and len(e) in (2, 3):
        return (int(e[0]), e[1], e[2] if len(e) == 3 else None, 0, False, False)
    raise TypeError("a step entry is a dict or a (seq, tokens[, sample]) tuple, not %r" % (e,))


# --------------------------------------------------------------------------
# Tokenizer and streaming detokenizer
# --------------------------------------------------------------------------


class Tokenizer(_Handle):
    """Byte-level BPE tokenizer.  Tokenizer.load(path) owns its handle; a
    model's tokenizer (Model.tokenizer) is borrowed and lives as long as the
    model."""
    _free = "dsq_tokenizer_free"

    def __init__(self, handle, owner=None):
        super().__init__(handle)
        self._owner = owner  # a borrowed handle is never freed here

    @classmethod
    def load(cls, path):
        h = _vp()
        _check(_L().dsq_tokenizer_load(os.fsencode(path), C.byref(h)),
               "dsq_tokenizer_load(%s)" % path)
        return cls(h.value)

    @property
    def handle(self):
        if self._owner is not None and not self._owner._h:
            raise ValueError("the model owning this tokenizer is closed")
        return super().handle

    def close(self):
        if self._owner is None:
            super().close()
        else:
            self._h = None

    def encode(self, text, add_special=False, plain_special=False):
        """Token ids (list of int) of str or UTF-8 bytes."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (TOKENIZE_ADD_SPECIAL if add_special else 0) | \
                (TOKENIZE_PLAIN_SPECIAL if plain_special else 0)
        n = _sz(0)
        cap = len(data) + 8  # byte-level BPE: at most one id per byte, plus BOS
        while True:
            buf = (_i32 * cap)()
            st = _L().dsq_tokenize(self.handle, data, len(data), flags, buf, cap, C.byref(n))
            if st != Status.ERR_BUFFER_TOO_SMALL:
                break
            cap = n.value
        _check(st, "dsq_tokenize")
        return buf[:n.value]

    def decode(self, tokens, skip_special=False, errors="replace"):
        """Text of token ids (str; bytes that are not UTF-8 per `errors`)."""
        return self.decode_bytes(tokens, skip_special).decode("utf-8", errors)

    def decode_bytes(self, tokens, skip_special=False):
        ids = _ids(tokens)
        n = _sz(0)
        cap = 16 * len(ids) + 1
        while True:
            buf = C.create_string_buffer(cap)
            st = _L().dsq_detokenize(self.handle, ids, len(ids), int(skip_special), buf, cap,
                                     C.byref(n))
            if st != Status.ERR_BUFFER_TOO_SMALL:
                break
            cap = n.value + 1
        _check(st, "dsq_detokenize")
        return buf.raw[:n.value]

    def __len__(self):
        return _L().dsq_tokenizer_n_tokens(self.handle)

    def token_id(self, text):
        """Id of the token whose stored text is exactly `text`, or -1."""
        return _L().dsq_tokenizer_token_id(self.handle, text.encode("utf-8"))

    def token_text(self, id):
        """Raw stored text of a token (byte-level form), or None."""
        t = _L().dsq_token_text(self.handle, id)
        return None if t is None else t.decode("utf-8", "replace")

    def is_special(self, id):
        return bool(_L().dsq_token_is_special(self.handle, id))

    @property
    def bos(self):
        return _L().dsq_tokenizer_bos(self.handle)

    @property
    def eos(self):
        return _L().dsq_tokenizer_eos(self.handle)

    def stream(self, skip_special=False):
        """A DetokStream that turns ids into complete UTF-8 text."""
        return DetokStream(self, skip_special)


class DetokStream(_Handle):
    """Feed ids one at a time with push(); get back only completed text."""
    _free = "dsq_detok_stream_free"

    def __init__(self, tokenizer, skip_special=False):
        h = _vp()
        _check(_L().dsq_detok_stream_new(tokenizer.handle, int(skip_special), C.byref(h)),
               "dsq_detok_stream_new")
        super().__init__(h.value)
        self.tokenizer = tokenizer  # must outlive the stream
        self._buf = C.create_string_buffer(1024)

    def _call(self, fn, *args):
        n = _sz(0)
        while True:
            st = fn(self.handle, *args, self._buf, len(self._buf), C.byref(n))
            if st != Status.ERR_BUFFER_TOO_SMALL:  # state is unchanged: retry bigger
                break
            self._buf = C.create_string_buffer(2 * len(self._buf))
        _check(st, fn.__name__)
        return self._buf.raw[:n.value].decode("utf-8", "replace")

    def push(self, token):
        return self._call(_L().dsq_detok_stream_push, token)

    def flush(self):
        """Whatever is still held (incomplete UTF-8 as U+FFFD); resets."""
        return self._call(_L().dsq_detok_stream_flush)


# --------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------


class Sampler(_Handle):
    """Next-token sampler (dsq_sampler_new).  Keywords set dsq_sampler_params
    fields: temperature (<= 0 is greedy), top_k, top_p, min_p,
    repetition_penalty, penalty_last_n, seed, n_vocab_valid."""
    _free = "dsq_sampler_free"

    def __init__(self, params=None, **fields):
        """params: a SamplerParams (e.g. Model.sampler_params()) to start
        from instead of the library defaults; keywords then set fields."""
        if params is None:
            p = _params(SamplerParams, fields, "dsq_sampler_params")
        else:
            p = SamplerParams.from_buffer_copy(params)
            for k, v in fields.items():
                if k not in {f[0] for f in SamplerParams._fields_} - {"struct_size"}:
                    raise TypeError("dsq_sampler_params has no field %r" % k)
                setattr(p, k, v)
        h = _vp()
        _check(_L().dsq_sampler_new(C.byref(p), C.byref(h)), "dsq_sampler_new")
        super().__init__(h.value)

    def sample(self, logits, row=0, n_vocab=None):
        """Draw a token from row `row` of a ctypes float array of
        [rows * n_vocab] logits (n_vocab defaults to its whole length)."""
        n = len(logits) if n_vocab is None else n_vocab
        if not isinstance(logits, C.Array) or logits._type_ is not _f32:
            logits = (_f32 * len(logits))(*logits)
        if (row + 1) * n > len(logits):
            raise ValueError("row %d of %d-wide logits is out of range" % (row, n))
        view = (_f32 * n).from_buffer(logits, row * n * C.sizeof(_f32))  # no copy
        tok = _i32()
        _check(_L().dsq_sampler_sample(self.handle, view, n, C.byref(tok)),
               "dsq_sampler_sample")
        return tok.value

    def accept(self, tokens):
        """Record tokens (e.g. the prompt) for the repetition penalty."""
        ids = _ids(tokens)
        _check(_L().dsq_sampler_accept(self.handle, ids, len(ids)), "dsq_sampler_accept")

    def reset(self, seed):
        _L().dsq_sampler_reset(self.handle, seed)


class Stopper(_Handle):
    """Stop-string matcher (dsq_stopper): push(id) returns (text, stopped);
    text never contains a stop string, and special tokens are not shown."""
    _free = "dsq_stopper_free"

    def __init__(self, tokenizer, stop=(), stop_on_eos=True):
        enc = [s.encode("utf-8") for s in stop]
        arr = (C.c_char_p * len(enc))(*enc) if enc else None
        h = _vp()
        _check(_L().dsq_stopper_new(tokenizer.handle, arr, len(enc), int(stop_on_eos), C.byref(h)),
               "dsq_stopper_new")
        super().__init__(h.value)
        self.tokenizer = tokenizer  # must outlive the stopper
        self._buf = C.create_string_buffer(256 + sum(len(e) for e in enc))

    def push(self, token):
        n, stopped = _sz(0), C.c_int(0)
        while True:
            st = _L().dsq_stopper_push(self.handle, token, self._buf, len(self._buf), C.byref(n),
                                       C.byref(stopped))
            if st != Status.ERR_BUFFER_TOO_SMALL:  # nothing changed: retry bigger
                break
            self._buf = C.create_string_buffer(n.value + 1)
        _check(st, "dsq_stopper_push")
        return self._buf.raw[:n.value].decode("utf-8", "replace"), bool(stopped.value)

    def flush(self):
        n = _sz(0)
        while True:
            st = _L().dsq_stopper_flush(self.handle, self._buf, len(self._buf), C.byref(n))
            if st != Status.ERR_BUFFER_TOO_SMALL:
                break
            self._buf = C.create_string_buffer(n.value + 1)
        _check(st, "dsq_stopper_flush")
        return self._buf.raw[:n.value].decode("utf-8", "replace")

    def reset(self):
        _L().dsq_stopper_reset(self.handle)
