#!/usr/bin/env python3
"""Static SASS census of a CUDA source without a GPU: what a kernel change
does to the code the GPU would run, read before any run.

  scripts/sass_census.py regs  FILE.cu [--arch sm_90a]
      registers and spills of every kernel (ptxas -v)
  scripts/sass_census.py same  FILE.cu REV [--arch sm_90a]
      every kernel of FILE.cu at REV (a git revision) against the working
      tree, instruction for instruction: "same" proves a refactor left that
      kernel's machine code alone (names are matched after --rename A=B)
  scripts/sass_census.py blocks FILE.cu KERNEL [--arch sm_90a]
      the basic blocks of KERNEL's largest loop (KERNEL: a prefix of the
      mangled name): size, LDGSTS / LDG / HMMA / BAR / UBLKCP counts and the
      block's last instruction, to add up the instructions of one path
      through an iteration by hand

Compiles with the library's device flags (nvcc -O3, the given arch) and
disassembles with cuobjdump, which some toolkits lack: `pip download
--no-deps nvidia-cuda-cuobjdump` and unzip the wheel, then put its bin/ on
PATH or set CUOBJDUMP.  Static counts say what a warp issues, not how long
it takes: timings come only from a GPU (docs/performance.md)."""
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvcc_cubin(src_root, rel, arch, out):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, "-O3", "-DNDEBUG", "-DDSQ_BUILDING_LIBRARY", "-DDSQ_HAVE_CUDA", "-D_GNU_SOURCE",
           "-I" + os.path.join(src_root, "include"), "-I" + os.path.join(src_root, "lib"),
           "-I" + os.path.join(src_root, "cuda"), "-gencode", f"arch=compute_{arch[3:]},code={arch}",
           "-cubin", "-Xptxas", "-v", "-o", out, os.path.join(src_root, rel)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return r.stderr


def sass(cubin):
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("cuobjdump not found: see this script's header")
    r = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    funcs = {}
    for part in re.split(r"\n\s*Function : ", r.stdout)[1:]:
        name = part.split("\n", 1)[0].strip()
        funcs[name] = [(int(m.group(1), 16), m.group(2).strip())
                       for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", part)]
    return funcs


def regs(ptxas_log):
    cur, out = None, []
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            sp = re.search(r"(\d+) bytes spill stores", ptxas_log.split(cur, 1)[1])
            out.append((cur, int(m.group(1)), int(sp.group(1)) if sp else 0))
            cur = None
    return out


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def blocks(ins):
    lo = hi = None
    for a, t in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) < a and (lo is None or a - int(m.group(1), 16) > hi - lo):
            lo, hi = int(m.group(1), 16), a
    if lo is None:
        sys.exit("no loop")
    idx = {a: i for i, (a, _) in enumerate(ins)}
    leaders = {lo}
    for a, t in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
        if lo <= a <= hi and m:
            leaders.add(int(m.group(1), 16))
            if idx[a] + 1 < len(ins):
                leaders.add(ins[idx[a] + 1][0])
    starts = sorted(x for x in leaders if lo <= x <= hi)
    keys = ["LDGSTS", "LDG", "HMMA", "BAR", "SYNCS", "UBLKCP", "STS"]
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else hi + 1
        blk = [t for a, t in ins if s <= a < e]
        c = collections.Counter(opcode(t) for t in blk)
        tags = " ".join(f"{x}:{c[x]}" for x in keys if c[x])
        print(f"{s:#07x} {len(blk):4d}  {tags:28s} | {blk[-1][:64] if blk else ''}")


def main():
    args = sys.argv[1:]
    arch = "sm_90a"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    renames = []
    while "--rename" in args:
        i = args.index("--rename")
        renames.append(args[i + 1].split("=", 1))
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    mode, rel = args[0], os.path.relpath(os.path.abspath(args[1]), ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        log = nvcc_cubin(ROOT, rel, arch, os.path.join(tmp, "new.cubin"))
        if mode == "regs":
            for name, n, sp in regs(log):
                print(f"{n:4d} registers {sp:5d} B spilled  {name}")
        elif mode == "blocks":
            funcs = sass(os.path.join(tmp, "new.cubin"))
            hits = [n for n in funcs if n.startswith(args[2])]
            if len(hits) != 1:
                sys.exit(f"{len(hits)} kernels match {args[2]}")
            print(hits[0])
            blocks(funcs[hits[0]])
        elif mode == "same":
            old_root = os.path.join(tmp, "old")
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old_root, args[2]], check=True)
            try:
                nvcc_cubin(old_root, rel, arch, os.path.join(tmp, "old.cubin"))
            finally:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_root], check=True)
            old, new = sass(os.path.join(tmp, "old.cubin")), sass(os.path.join(tmp, "new.cubin"))
            for name, ins in sorted(old.items()):
                m = name
                for a, b in renames:
                    m = m.replace(a, b)
                got = new.get(m)
                what = "missing" if got is None else "same" if [t for _, t in got] == [t for _, t in ins] else "DIFF"
                print(f"{what:7s} {len(ins):5d} -> {len(got) if got else 0:5d}  {m}")
            for name in sorted(set(new) - {n for n in old}):
                if not any(name == o.replace(a, b) for o in old for a, b in renames):
                    print(f"new     {0:5d} -> {len(new[name]):5d}  {name}")
        else:
            sys.exit(__doc__)


if __name__ == "__main__":
    main()
