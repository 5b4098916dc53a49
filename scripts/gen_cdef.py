#!/usr/bin/env python3
"""gen_cdef.py - declarations of include/dsqwen.h that cffi's ffi.cdef() accepts.

cffi parses only plain declarations: no include guards, no #include, no
attribute macros, no function bodies.  This keeps, in header order, the
typedefs, enums, structs and DSQ_API prototypes, drops the preprocessor
lines and the static inline *_default_params() (not exported: cffi users
call *_params_init(p, ffi.sizeof(p[0])) instead), and turns the integer
#defines into cdef constants.  Comments are dropped.

    gen_cdef.py [HEADER] [-o OUT]       (default: include/dsqwen.h, stdout)
    gen_cdef.py --check OUT             exit 1 if OUT is not what HEADER gives

Standard library only; run by setup.py at build time and checked in CI.
"""
import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HEADER = os.path.join(HERE, "..", "include", "dsqwen.h")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def drop_static_inline(text):
    """Remove `static inline ... { body }` definitions (brace-matched)."""
    out, i = [], 0
    while True:
        j = text.find("static inline", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k = text.index("{", j)
        depth = 0
        while True:
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1


def generate(header_text):
    text = strip_comments(header_text)
    consts, body, skip = [], [], 0
    lines = text.replace("\\\n", " ").split("\n")
    for line in lines:
        s = line.strip()
        if s.startswith("#"):
            d = s[1:].strip()
            if d.startswith("ifdef __cplusplus"):
                skip += 1           # extern "C" { ... } belongs to C++ only
            elif skip and d.startswith("endif"):
                skip -= 1
            m = re.match(r"define\s+(DSQ_[A-Z0-9_]+)\s+(\d+)u?\s*$", d)
            if m:
                consts.append("#define %s %s" % (m.group(1), m.group(2)))
            continue
        if skip:
            continue
        body.append(line)
    text = "\n".join(body)
    text = drop_static_inline(text)
    text = re.sub(r"\bDSQ_API\s+", "", text)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    head = ("/* Generated from include/dsqwen.h by scripts/gen_cdef.py: do not edit.\n"
            " * For cffi: ffi.cdef(text); then ffi.dlopen(path of libdsqwen.so). */\n")
    return head + "\n".join(consts) + "\n\n" + text + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("header", nargs="?", default=DEFAULT_HEADER)
    ap.add_argument("-o", "--output")
    ap.add_argument("--check", metavar="FILE", help="compare FILE with the generated text")
    a = ap.parse_args()
    with open(a.header, encoding="utf-8") as f:
        out = generate(f.read())
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            if f.read() != out:
                print("%s is not current with %s: rerun scripts/gen_cdef.py" % (a.check, a.header),
                      file=sys.stderr)
                return 1
        return 0
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(out)
    else:
        sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
