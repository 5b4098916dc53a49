#!/usr/bin/env bash
# Download the Debian packages the GPU test machine lacks (it has no -dev
# packages and no network) into .deps/ (git-ignored), to be carried there and
# unpacked by scripts/device_env.sh.  Run once on a development machine.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo /.deps/ >> .git/info/exclude
mkdir -p .deps
cd .deps
apt-get download libcjson1 libcjson-dev libcmocka0 libcmocka-dev libpcre2-8-0 libpcre2-dev \
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc2 libutf8proc-dev \
  libmicrohttpd12 libmicrohttpd-dev
ls -1
