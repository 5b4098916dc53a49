"""dsqwen - Python bindings for libdsqwen (DeepSeek-R1-Distill-Qwen inference).

    import dsqwen
    model = dsqwen.Model("path/to/model")            # backend="auto" | "cpu" | "cuda"
    model = dsqwen.Model("path/to/model", progress=lambda f: print("%3.0f%%" % (100 * f)))
    for piece in model.generate("Why is the sky blue?", max_tokens=64):
        print(piece, end="", flush=True)
    for piece in model.chat([("user", "Hi!")], temperature=0.6):
        print(piece, end="", flush=True)

Lower level: Model.context() gives a Context (prefill / decode_step with
logits as ctypes arrays, or numpy arrays with numpy=True; step() for mixed
batches sampled inside the library, fork() and truncate()), Sampler, Tokenizer
(Model.tokenizer), DetokStream and Stopper, all closable and usable with
`with`.  Errors raise DsqError (.status, .name, .message).  build_features()
and backend_available("cuda") say what the library can run on.

The library is found through DSQWEN_LIBRARY, else the copy installed inside
this package, else the install prefix's lib directories, else the system
loader; library_path() says which was loaded.  cffi users: cdef() returns
declarations of the whole C API for ffi.cdef().
"""
import os as _os

from ._capi import (Backend, ChatMessage, Context, CtxInfo, CtxParams, DetokStream, DsqError,
                    KvDtype, KvLayout, LogLevel, Model, ModelInfo, ModelParams, Quantize, Role,
                    Sampler, SampleParams, SamplerParams, Status, StepResult, Stopper, Tokenizer, argmax,
                    backend_available, build_features, chat_format, has_step, library_path,
                    load_library, set_log_callback, version)

__version__ = "0.1.0"
__all__ = ["Backend", "ChatMessage", "Context", "CtxInfo", "CtxParams", "DetokStream",
           "DsqError", "KvDtype", "KvLayout", "LogLevel", "Model", "ModelInfo", "ModelParams",
           "Quantize", "Role", "SampleParams", "Sampler", "SamplerParams", "Status", "StepResult", "Stopper",
           "Tokenizer", "argmax", "backend_available", "build_features", "chat_format", "has_step", "library_path", "load_library", "set_log_callback", "version",
           "cdef", "cdef_path"]


def cdef_path():
    """Path of dsqwen_cdef.h: the C API as declarations cffi's ffi.cdef()
    accepts, generated from dsqwen.h when this package was built."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "dsqwen_cdef.h")


def cdef():
    """The text of dsqwen_cdef.h (see cdef_path())."""
    with open(cdef_path(), encoding="utf-8") as f:
        return f.read()
