"""pip install of kvferry's Python package (docs/vllm.md "Install with pip"): the compiled module
`kvferry._kvferry`, `kvferry`, `kvferry.sglang`, `kvferry.vllm`, and the SGLang plugin entry point.

    python3 -m pip install --no-build-isolation .      # no network: what Debian ships (setuptools, wheel)

The extension is built by CMake (the same build as `make build`, the libraries' Debian packages
must be installed: `make deps`), for the interpreter that runs pip. With KVFERRY_CMAKE_BUILD_DIR
naming a configured kvferry build directory (e.g. `build` after `make build`), only its `_kvferry`
target is brought up to date and copied (same Python version required); otherwise a build
directory `build-pip/cmake` is configured for `sys.executable` and built (several minutes).
The `kvferry` CLI is not part of the wheel (`cmake --install build`, README "Install").
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(kvferry VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("KVFERRY_CMAKE_BUILD_DIR")
        jobs = str(os.cpu_count() or 2)
        if not build_dir:
            build_dir = os.path.join(ROOT, "build-pip", "cmake")
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_kvferry", "-j", jobs])
        built = glob.glob(os.path.join(build_dir, "python", "kvferry", "_kvferry*.so"))
        want = os.path.basename(self.get_ext_fullpath(ext.name))
        match = [p for p in built if os.path.basename(p) == want]
        if not match:
            raise RuntimeError(f"{build_dir} has no {want} (built: {built}); it was configured for another Python")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(match[0], dest)


setup(
    name="kvferry",
    version=version(),
    description="KV-cache transfer from prefill to decode ranks (PD disaggregation): SGLang and vLLM connectors",
    package_dir={"": "python"},
    packages=["kvferry", "kvferry.sglang", "kvferry.vllm"],
    ext_modules=[Extension("kvferry._kvferry", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"sglang.srt.plugins": ["kvferry = kvferry.sglang.plugin:register"]},
    python_requires=">=3.9",
    zip_safe=False,
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")}, "egg_info": {"egg_base": "build-pip"}},
)
