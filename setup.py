"""setup.py - builds libdsqwen with CMake for the Python package (see pyproject.toml).

`build_py` first configures and builds the `dsqwen` CMake target in
build-python/cmake (CMAKE_ARGS from the environment is passed through, e.g.
-DDSQ_CUDA=OFF), then puts the shared library into the package as
dsqwen/libdsqwen.so.0 (its soname; the real file, since wheels hold no
symlinks) and writes dsqwen/dsqwen_cdef.h with scripts/gen_cdef.py from
include/dsqwen.h, so the cffi declarations always match the header built.
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
SONAME = "libdsqwen.so.0"


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        bdir = os.path.join(ROOT, "build-python", "cmake")
        args = ["-DCMAKE_BUILD_TYPE=Release", "-DDSQ_BUILD_TESTS=OFF", "-DDSQ_BUILD_EXAMPLES=OFF"]
        args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", bdir] + args)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", bdir, "--target", "dsqwen", "-j", jobs])
        libs = [p for p in glob.glob(os.path.join(bdir, "libdsqwen.so.*.*")) if not os.path.islink(p)]
        if len(libs) != 1:
            raise RuntimeError("expected one libdsqwen.so.X.Y.Z in %s, found %r" % (bdir, libs))
        pkg = os.path.join(self.build_lib, "dsqwen")
        os.makedirs(pkg, exist_ok=True)
        shutil.copyfile(libs[0], os.path.join(pkg, SONAME))
        os.chmod(os.path.join(pkg, SONAME), 0o755)
        subprocess.check_call([sys.executable, os.path.join(ROOT, "scripts", "gen_cdef.py"),
                               os.path.join(ROOT, "include", "dsqwen.h"),
                               "-o", os.path.join(pkg, "dsqwen_cdef.h")])


class BinaryDistribution(Distribution):
    """The package holds a native library: wheels are platform-specific."""

    def has_ext_modules(self):
        return True


os.makedirs(os.path.join(ROOT, "build-python"), exist_ok=True)  # egg_base must exist
setup(
    packages=["dsqwen"],
    package_dir={"": "python"},
    cmdclass={"build_py": BuildWithCMake},
    distclass=BinaryDistribution,
    options={"build": {"build_base": "build-python"},
             "egg_info": {"egg_base": "build-python"}},
    zip_safe=False,
)
