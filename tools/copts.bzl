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
    # GCC 12 at -O2 reports std::string's own inlined memcpy (char_traits.h)
    # as overlapping by 2^63 bytes wherever strings are concatenated
    # (GCC PR 105329, fixed in GCC 13): a compiler bug, not Ember's code.
    "-Wno-restrict",
    "-Werror=return-type",
    "-pthread",
]

EMBER_LINKOPTS = ["-pthread"]

def _copts(extra):
    """EMBER_COPTS, plus -Werror in Ember's own workspace: first-party code
    builds without warnings and stays so. A workspace that builds Ember as a
    dependency (with its own compiler, whose newer warnings Ember cannot know)
    gets the warnings, not failures. System headers stay out of it: they are
    -isystem includes, for which the compiler reports nothing."""
    own = ["-Werror"] if native.repository_name() == "@" else []
    return EMBER_COPTS + own + extra

def execroot_path(path):
    """path, relative to the calling BUILD file's package, as the compiler
    sees it from the execution root: for flags that name a directory
    (-idirafter), which Bazel does not rebase when Ember is @ember and its
    files lie under external/ember/."""
    repo = native.repository_name()
    root = "" if repo == "@" else "external/" + repo[1:] + "/"
    return root + native.package_name() + "/" + path

def ember_cc_library(name, copts = [], linkopts = [], **kwargs):
    native.cc_library(
        name = name,
        copts = _copts(copts),
        linkopts = EMBER_LINKOPTS + linkopts,
        **kwargs
    )

def ember_cc_binary(name, copts = [], linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = _copts(copts),
        linkopts = EMBER_LINKOPTS + linkopts,
        **kwargs
    )

def ember_cc_test(name, copts = [], linkopts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test (gtest_main is linked in); small unless told."""
    native.cc_test(
        name = name,
        size = size,
        copts = _copts(copts),
        linkopts = EMBER_LINKOPTS + linkopts,
        deps = deps + ["@ember//third_party/googletest:gtest_main"],
        **kwargs
    )

def ember_cc_benchmark(name, copts = [], linkopts = [], deps = [], tags = [], **kwargs):
    """A Google Benchmark binary. Run it with `bazel run`; it is also built by
    `bazel build //...` but never run as a test."""
    native.cc_binary(
        name = name,
        copts = _copts(copts),
        linkopts = EMBER_LINKOPTS + linkopts,
        deps = deps + ["@ember//third_party/benchmark:benchmark_main"],
        tags = tags + ["benchmark"],
        **kwargs
    )
