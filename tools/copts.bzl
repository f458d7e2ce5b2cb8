"""The one home of Ember's compiler flags and its cc_* wrappers.

Every first-party C++ target is declared through these macros so that the
language standard, warnings and link flags stay identical across the tree and
reach consumers' builds of Ember too.
"""

EMBER_COPTS = [
    "-std=c++20",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    # Options structs are filled with designated initializers that name only
    # the fields that differ from their defaults ({.timeout = ...}); -Wextra
    # would flag every such use.
    "-Wno-missing-field-initializers",
    "-Werror=return-type",
    "-pthread",
]

EMBER_LINKOPTS = ["-pthread"]

def ember_cc_library(name, copts = [], linkopts = [], **kwargs):
    native.cc_library(
        name = name,
        copts = EMBER_COPTS + copts,
        linkopts = EMBER_LINKOPTS + linkopts,
        **kwargs
    )

def ember_cc_binary(name, copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = EMBER_COPTS + copts,
        linkopts = EMBER_LINKOPTS + linkopts,
        **kwargs
    )

def ember_cc_test(name, copts = [], linkopts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test (gtest_main is linked in); small unless told."""
    native.cc_test(
        name = name,
        size = size,
        copts = EMBER_COPTS + copts,
        linkopts = EMBER_LINKOPTS + linkopts,
        deps = deps + ["@ember//third_party/googletest:gtest_main"],
        **kwargs
    )

def ember_cc_benchmark(name, copts = [], linkopts = [], deps = [], tags = [], **kwargs):
    """A Google Benchmark binary. Run it with `bazel run`; it is also built by
    `bazel build //...` but never run as a test."""
    native.cc_binary(
        name = name,
        copts = EMBER_COPTS + copts,
        linkopts = EMBER_LINKOPTS + linkopts,
        deps = deps + ["@ember//third_party/benchmark:benchmark_main"],
        tags = tags + ["benchmark"],
        **kwargs
    )
