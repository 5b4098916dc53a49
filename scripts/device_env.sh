# Source on the GPU test machine (no -dev packages, no network there; make
# .deps/ first with scripts/fetch_device_deps.sh and carry it): unpacks
# the carried Debian packages from .deps/ into /tmp/deps and points pkg-config,
# CMake and the loader at them.  Usage: `source scripts/device_env.sh`.
mkdir -p /tmp/deps
for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
# The .pc files say prefix=/usr: rewrite them to the unpacked location (a
# PKG_CONFIG_SYSROOT_DIR would also be applied to our own installed dsqwen.pc).
sed -i -E 's#^(prefix|libdir|includedir)=/usr(/|$)#\1=/tmp/deps/usr\2#' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc \
  /tmp/deps/usr/share/pkgconfig/*.pc 2>/dev/null || true
export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/deps/usr/share/pkgconfig
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMAKE_PREFIX_PATH=/tmp/deps/usr
