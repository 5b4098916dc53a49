#!/usr/bin/env python3
"""Layouts of the public types of dsqwen.h, and the rules they must keep.

abidiff (libabigail 2.2) checks the exported functions and everything
reachable from them, but two rules of this project are beyond it:

  * the struct_size-versioned structs may grow by appended fields, and
    nothing else: abidiff's `has_data_member_inserted_at = end` suppression
    also hid reordered and retyped fields when tried, so check_abi.sh
    suppresses these structs in abidiff and this script checks them;
  * enums whose values travel in int32_t fields (dsq_backend, dsq_kv_layout,
    dsq_kv_dtype, dsq_role) are reachable from no function signature, so
    abidiff never sees their values change.

  abi_types.py dump ABIXML        print the layout of every struct and enum
                                  declared in dsqwen.h (from `abidw
                                  --load-all-types` output), one line each
  abi_types.py compare BASE NEW   compare two dumps; exit 1 on a break

Rules: an enumerator keeps its value (new enumerators are fine); a
non-versioned struct keeps its size and every member (name, offset, type);
a versioned struct keeps its members as a prefix and may append after them.
"""
import sys
import xml.etree.ElementTree as ET

HEADER = "dsqwen.h"
VERSIONED = {"dsq_model_params", "dsq_model_info", "dsq_ctx_params", "dsq_ctx_info",
             "dsq_sampler_params"}


def dump(path):
    root = ET.parse(path).getroot()
    by_id = {}
    for el in root.iter():
        if "id" in el.attrib:
            by_id.setdefault(el.attrib["id"], el)

    def tname(tid, depth=0):
        """Spelling of a type down to its base type, so that int32_t ->
        int64_t or a pointer -> int changes the string."""
        el = by_id.get(tid)
        if el is None or depth > 20:
            return "?"
        tag, a = el.tag, el.attrib
        if tag == "type-decl":
            return "%s:%s" % (a.get("name"), a.get("size-in-bits", "0"))
        if tag == "typedef-decl":
            return "%s=%s" % (a["name"], tname(a["type-id"], depth + 1))
        if tag == "pointer-type-def":
            return tname(a["type-id"], depth + 1) + "*"
        if tag == "qualified-type-def":
            q = " ".join(k for k in ("const", "volatile", "restrict") if a.get(k) == "yes")
            return "%s %s" % (q, tname(a["type-id"], depth + 1))
        if tag == "array-type-def":
            return "%s[%s bits]" % (tname(a["type-id"], depth + 1), a.get("size-in-bits", "?"))
        if tag == "class-decl":
            return "struct " + a.get("name", "")
        if tag == "union-decl":
            return "union " + a.get("name", "")
        if tag == "enum-decl":
            return "enum " + a.get("name", "")
        if tag == "function-type":
            return "function"
        return tag

    out = set()
    for el in root.iter():
        a = el.attrib
        if a.get("filepath", "").split("/")[-1] != HEADER or a.get("is-declaration-only") == "yes":
            continue
        if el.tag == "enum-decl" and a.get("name"):
            for e in el.findall("enumerator"):
                out.add("enum %s %s = %s" % (a["name"], e.attrib["name"], e.attrib["value"]))
        elif el.tag == "class-decl" and a.get("name"):
            out.add("struct %s size %s" % (a["name"], a.get("size-in-bits")))
            for i, dm in enumerate(el.findall("data-member")):
                v = dm.find("var-decl")
                out.add("struct %s member %03d %s offset %s type %s" %
                        (a["name"], i, v.attrib["name"], dm.attrib.get("layout-offset-in-bits"),
                         tname(v.attrib["type-id"])))
    for line in sorted(out):
        print(line)


def parse(path):
    enums, sizes, members = {}, {}, {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "enum":
                enums[(w[1], w[2])] = w[4]
            elif w[2] == "size":
                sizes[w[1]] = int(w[3])
            else:  # struct NAME member IDX FIELD offset OFF type T...
                members.setdefault(w[1], []).append((w[4], w[6], " ".join(w[8:])))
    return enums, sizes, members


def compare(base_path, new_path):
    be, bs, bm = parse(base_path)
    ne, ns, nm = parse(new_path)
    errors = []
    if not bs or not be:
        errors.append("baseline %s lists no structs or enums" % base_path)
    if not ns or not ne:
        errors.append("%s lists no structs or enums: was the library built with -g?" % new_path)
    for (enum, name), value in sorted(be.items()):
        if (enum, name) not in ne:
            errors.append("enum %s: %s removed" % (enum, name))
        elif ne[(enum, name)] != value:
            errors.append("enum %s: %s changed from %s to %s" % (enum, name, value, ne[(enum, name)]))
    for s in sorted(bs):
        if s not in ns:
            errors.append("struct %s removed" % s)
            continue
        old, new = bm.get(s, []), nm.get(s, [])
        if s in VERSIONED:
            if new[:len(old)] != old:
                errors.append("versioned struct %s: its first %d members changed (only appending "
                              "is allowed)\n    was: %s\n    now: %s" % (s, len(old), old, new[:len(old)]))
            elif ns[s] < bs[s]:
                errors.append("versioned struct %s shrank from %d to %d bits" % (s, bs[s], ns[s]))
        elif old != new or bs[s] != ns[s]:
            errors.append("struct %s changed (size %d -> %d bits)\n    was: %s\n    now: %s" %
                          (s, bs[s], ns[s], old, new))
    for e in errors:
        print("abi_types: " + e)
    added = sorted(set(ns) - set(bs))
    grown = sorted(s for s in bs if s in ns and len(nm.get(s, [])) > len(bm.get(s, [])))
    print("abi_types: %d structs, %d enumerators checked; grown: %s; new structs: %s" %
          (len(bs), len(be), ", ".join(grown) or "none", ", ".join(added) or "none"))
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
