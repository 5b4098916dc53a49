#!/bin/sh
# One libdsqwen.so for machines with and without CUDA: checks that the
# library has no CUDA shared library among its NEEDED entries, then runs
# nocuda_consumer twice:
#   visible  as the machine is (control: cuBLASLt is found when present);
#   hidden   in a private mount namespace (unshare: user + mount) where every
#            CUDA library file the loader could reach -- libcublas*,
#            libcudart*, libcuda.so*, libnccl* in the ld.so cache, the
#            toolkit's directories, LD_LIBRARY_PATH and the system library
#            directories -- has an empty file bind-mounted over it, so
#            dlopen fails as on a machine without them.  The library and the
#            program are the very files built, unmodified.
# The hidden run proves: the library loads, AUTO runs on the CPU, CUDA is
# refused with DSQ_ERR_NO_DEVICE naming libcublasLt and libcuda.so.1, and no
# CUDA library gets mapped.  Exit 77 (ctest SKIP) with the reason when the
# library was built without CUDA or no namespace can be made here.
#   no_cuda_libs.sh LIB CONSUMER MODEL_DIR HAVE_CUDA(ON|OFF) [TOOLKIT_LIBDIR]
set -u
lib=$1 consumer=$2 model=$3 have_cuda=$4 toolkit=${5:-}

needed=$(readelf -d "$lib" | grep NEEDED) || { echo "FAIL: readelf -d $lib"; exit 1; }
echo "$needed"
if echo "$needed" | grep -Eq 'lib(cublas|cudart|cuda\.|cudnn|nccl|nvrtc)'; then
    echo "FAIL: $lib needs a CUDA shared library at load time"
    exit 1
fi
echo "no CUDA library among the NEEDED entries"
if [ "$have_cuda" != ON ]; then
    echo "SKIP: this libdsqwen was built without CUDA; nothing to hide"
    exit 77
fi

"$consumer" "$model" visible || exit 1

dirs="$toolkit /usr/local/lib /usr/local/lib64 /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib"
for d in /usr/local/cuda*/lib /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib; do dirs="$dirs $d"; done
old_ifs=$IFS; IFS=:; for d in ${LD_LIBRARY_PATH:-}; do dirs="$dirs $d"; done; IFS=$old_ifs
files=$( (ldconfig -p 2>/dev/null | sed -n 's/.*=> //p'
          for d in $dirs; do [ -d "$d" ] && ls -d "$d"/lib* 2>/dev/null; done) |
        grep -E '/lib(cublas|cublasLt|cudart|cuda|nccl)\.so' |
        while read -r f; do [ -e "$f" ] && readlink -f "$f"; done | sort -u)
echo "hiding $(echo "$files" | grep -c .) CUDA library files"
empty=$(mktemp) || exit 1
trap 'rm -f "$empty"' EXIT
if ! unshare -rm true 2>/dev/null; then
    echo "SKIP: cannot make a user + mount namespace here (unshare -rm); the hidden run did not happen"
    exit 77
fi
# shellcheck disable=SC2016
unshare -rm sh -c '
    empty=$1 consumer=$2 model=$3; shift 3
    for f in "$@"; do mount --bind "$empty" "$f" || { echo "FAIL: cannot hide $f"; exit 1; }; done
    exec "$consumer" "$model" hidden' sh "$empty" "$consumer" "$model" $files
