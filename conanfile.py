# SPDX-License-Identifier: BSL-1.0
"""Conan 2 recipe for memalg, a header-only library.

    conan create .                     # package the local source, then build test_package
    conan create . -o memalg/*:boost=conan   # take Boost from a Conan remote instead

The version is read from the top-level CMakeLists.txt, so it is the one the CMake package,
memalg/version.hpp and `memalg --version` carry. By default Boost's headers come from the
system (Debian's libboost-dev), so the recipe has no Conan requirement and builds offline.
"""
import os
import re

from conan import ConanFile
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import load


class MemalgConan(ConanFile):
    name = "memalg"
    license = "BSL-1.0"
    description = ("Compile-time GPU memory planning for neural-network training: a header-only "
                   "C++20 library whose static_assert fails the build of a configuration that "
                   "would run out of memory")
    topics = ("gpu", "memory", "deep-learning", "header-only", "constexpr")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"boost": ["system", "conan"]}
    default_options = {"boost": "system"}
    exports_sources = ("CMakeLists.txt", "cmake/*", "include/*", "docs/*", "LICENSE", "NOTICE",
                       "CHANGELOG.md", "README.md")
    no_copy_source = True

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        self.version = re.search(r"project\(memalg VERSION ([0-9]+\.[0-9]+\.[0-9]+)", text).group(1)

    def requirements(self):
        if self.options.boost == "conan":
            self.requires("boost/1.86.0", transitive_headers=True)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        # Only the library and its CMake package: no tools, tests, examples, benchmarks or CUDA.
        for flag in ("MEMALG_BUILD_TESTS", "MEMALG_BUILD_EXAMPLES", "MEMALG_BUILD_TOOLS",
                     "MEMALG_BUILD_BENCH", "MEMALG_WITH_CUDA"):
            tc.cache_variables[flag] = False
        tc.generate()
        if self.options.boost == "conan":
            CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()  # generates memalg/version.hpp; there is nothing to compile

    def package(self):
        CMake(self).install()

    def package_id(self):
        self.info.clear()

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "memalg")
        self.cpp_info.set_property("cmake_target_name", "memalg::memalg")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        if self.options.boost == "conan":
            self.cpp_info.requires = ["boost::headers"]
