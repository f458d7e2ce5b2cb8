"""Declares every external repository Ember needs, all of them local.

Bazel 4 appends DEFAULT.WORKSPACE.SUFFIX to every WORKSPACE; it declares
http_archive repositories (rules_cc, rules_java, platforms, bazel_skylib,
remote_coverage_tools) that cannot be fetched without a network. Declaring a
local repository under the same name first makes the suffix skip it.

Usage, from Ember's WORKSPACE or from a consumer's:

    load("@ember//tools:repositories.bzl", "ember_dependencies")
    ember_dependencies()
"""

load("//tools:cuda_configure.bzl", "cuda_configure")
load("//tools/release:static_archives.bzl", "ember_static_archives")

_RULES_CC_DEFS = '''"""Forwards to Bazel's native C++ rules (Bazel 4 ships them built in)."""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
fdo_prefetch_hints = native.fdo_prefetch_hints
fdo_profile = native.fdo_profile
objc_library = native.objc_library
objc_import = native.objc_import
'''

def _rules_cc_impl(ctx):
    ctx.file("WORKSPACE", 'workspace(name = "rules_cc")\n')
    ctx.file("BUILD", "")
    ctx.file("cc/defs.bzl", _RULES_CC_DEFS)
    ctx.file("cc/BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        'alias(name = "toolchain_type", actual = "@bazel_tools//tools/cpp:toolchain_type")',
        "",
    ]))

_rules_cc = repository_rule(implementation = _rules_cc_impl)

def _coverage_tools_impl(ctx):
    ctx.file("WORKSPACE", 'workspace(name = "remote_coverage_tools")\n')
    ctx.file("unavailable.sh", "echo 'coverage tools are not available offline' >&2\nexit 1\n", executable = True)
    ctx.file("BUILD", "\n".join([
        'package(default_visibility = ["//visibility:public"])',
        'sh_binary(name = "coverage_report_generator", srcs = ["unavailable.sh"])',
        'sh_binary(name = "lcov_merger", srcs = ["unavailable.sh"])',
        "",
    ]))

_coverage_tools = repository_rule(implementation = _coverage_tools_impl)

# The Debian packages Ember's third_party/ wrappers link, and a header and a
# library each installs (paths relative to the system root): what
# @ember_system_libraries checks.
_SYSTEM_LIBRARIES = {
    "abseil": ("libabsl-dev", ["usr/include/absl/base/config.h", "usr/lib/x86_64-linux-gnu/libabsl_base.so"]),
    "googletest": ("libgtest-dev", ["usr/include/gtest/gtest.h", "usr/lib/x86_64-linux-gnu/libgtest.a"]),
    "gmock": ("libgmock-dev", ["usr/include/gmock/gmock.h", "usr/lib/x86_64-linux-gnu/libgmock.a"]),
    "benchmark": ("libbenchmark-dev", ["usr/include/benchmark/benchmark.h", "usr/lib/x86_64-linux-gnu/libbenchmark.so"]),
    "protobuf": ("libprotobuf-dev", ["usr/include/google/protobuf/message.h", "usr/lib/x86_64-linux-gnu/libprotobuf.so"]),
    "protoc": ("protobuf-compiler", ["usr/bin/protoc"]),
    "grpc": ("libgrpc++-dev", ["usr/include/grpcpp/grpcpp.h", "usr/lib/x86_64-linux-gnu/libgrpc++.so"]),
    "grpc_plugin": ("protobuf-compiler-grpc", ["usr/bin/grpc_cpp_plugin"]),
    "gloo": ("libgloo-dev", ["usr/include/gloo/rendezvous/context.h", "usr/lib/libgloo.so"]),
    "openblas": ("libopenblas-dev", ["usr/include/x86_64-linux-gnu/cblas.h", "usr/lib/x86_64-linux-gnu/libopenblas.so"]),
    "dnnl": ("libdnnl-dev", ["usr/include/oneapi/dnnl/dnnl.hpp", "usr/lib/x86_64-linux-gnu/libdnnl.so"]),
    "curl": ("libcurl4-openssl-dev", ["usr/include/x86_64-linux-gnu/curl/curl.h", "usr/lib/x86_64-linux-gnu/libcurl.so"]),
    "libarchive": ("libarchive-dev", ["usr/include/archive.h", "usr/lib/x86_64-linux-gnu/libarchive.so"]),
    "jpeg": ("libjpeg62-turbo-dev", ["usr/include/jpeglib.h", "usr/lib/x86_64-linux-gnu/libjpeg.so"]),
}

_SYSTEM_LIBRARY_BZL = '''"""A system library's stand-in in the third_party wrappers' deps."""

def _present_impl(ctx):
    # An empty CcInfo: adds no include path, so the wrappers' compile and
    # link command lines stay the same.
    return [CcInfo()]

present_package = rule(implementation = _present_impl)

def _missing_impl(ctx):
    fail(ctx.attr.message)

# A missing package: analysing a target that depends on it fails.
missing_package = rule(implementation = _missing_impl, attrs = {"message": attr.string()})
'''

def _system_libraries_impl(ctx):
    root = ctx.attr.root.rstrip("/") + "/"
    build = [
        "# Written by ember_dependencies() (tools/repositories.bzl): one target per",
        "# system library; a missing one fails, naming its Debian package, when a",
        "# build needs it.",
        'load(":system_library.bzl", "missing_package", "present_package")',
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
    ]
    for name, (package, files) in sorted(_SYSTEM_LIBRARIES.items()):
        missing = [root + f for f in files if not ctx.path(root + f).exists]
        if not missing:
            build.append('present_package(name = "%s")\n' % name)
            continue
        message = ("Ember needs the Debian package %s (for %s), which is not installed: " +
                   "%s missing. Install it with `apt-get install %s`, or run Ember's " +
                   "tools/setup.sh, which installs every package Ember needs.") % (
            package,
            name,
            " and ".join(missing) + (" is" if len(missing) == 1 else " are"),
            package,
        )
        build.append("missing_package(name = %s, message = %s)\n" % (repr(name), repr(message)))
    ctx.file("system_library.bzl", _SYSTEM_LIBRARY_BZL)
    ctx.file("BUILD.bazel", "\n".join(build))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

_system_libraries = repository_rule(
    implementation = _system_libraries_impl,
    attrs = {"root": attr.string(default = "/")},
    local = True,
)

def _local_toolkit_impl(ctx):
    """A toolkit installed outside /usr (OpenMPI) as a repository: its
    tree with `build_file`, or, when it is missing under the root, the same
    targets failing with a message that says what to install."""
    root = ctx.attr.root.rstrip("/") + "/"
    path = ctx.path(root + ctx.attr.path.lstrip("/"))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    if path.exists:
        for entry in path.readdir():
            ctx.symlink(entry, entry.basename)
        ctx.symlink(ctx.attr.build_file, "BUILD.bazel")
        return
    message = ("Ember needs %s, which is not installed: %s is missing. %s") % (
        ctx.attr.what,
        str(path),
        ctx.attr.install,
    )
    build = [
        "# Written by ember_dependencies() (tools/repositories.bzl): the toolkit",
        "# is missing, so every target fails, saying what to install.",
        'load(":system_library.bzl", "missing_package")',
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
    ]
    for target in ctx.attr.targets:
        build.append("missing_package(name = %s, message = %s)\n" % (repr(target), repr(message)))
    ctx.file("system_library.bzl", _SYSTEM_LIBRARY_BZL)
    ctx.file("BUILD.bazel", "\n".join(build))

_local_toolkit = repository_rule(
    implementation = _local_toolkit_impl,
    attrs = {
        "root": attr.string(default = "/"),
        "path": attr.string(mandatory = True),
        "build_file": attr.label(mandatory = True),
        "targets": attr.string_list(mandatory = True),
        "what": attr.string(mandatory = True),
        "install": attr.string(mandatory = True),
    },
    local = True,
)

def _maybe(rule, name, **kwargs):
    if name not in native.existing_rules():
        rule(name = name, **kwargs)

def ember_dependencies(system_root = "/"):
    """Declares Ember's external repositories unless the caller already did.

    Args:
      system_root: where the Debian packages Ember links and the CUDA
        toolkit (usr/local/cuda under it, unless EMBER_CUDA_PATH names
        another place) are installed ("/"). A build that needs a library
        whose files are missing there fails with a message naming what to
        install, not a linker error; without the CUDA toolkit, Ember is built
        without CUDA support (tools/cuda_configure.bzl).
    """
    _maybe(_system_libraries, "ember_system_libraries", root = system_root)
    _maybe(_rules_cc, "rules_cc")
    _maybe(_coverage_tools, "remote_coverage_tools")
    _maybe(native.local_repository, "rules_java", path = "/usr/share/bazel/rules/java")
    _maybe(native.local_repository, "platforms", path = "/usr/share/bazel/tools/platforms")
    _maybe(native.local_repository, "bazel_skylib", path = "/usr/share/bazel/tools/skylib")
    # With CUDA when the toolkit is found, without it otherwise; EMBER_CUDA and
    # EMBER_CUDA_PATH decide (Note [Builds with and without CUDA]).
    _maybe(
        cuda_configure,
        "ember_cuda",
        system_root = system_root,
        build_file = "@ember//third_party/cuda:local_cuda.BUILD",
    )
    _maybe(
        _local_toolkit,
        "local_mpi",
        root = system_root,
        path = "usr/lib/x86_64-linux-gnu/openmpi",
        build_file = "@ember//third_party/mpi:local_mpi.BUILD",
        targets = ["mpi"],
        what = "the Debian package libopenmpi-dev (for mpi)",
        install = ("Install it with `apt-get install libopenmpi-dev`, or run Ember's " +
                   "tools/setup.sh, which installs every package Ember needs."),
    )

    # Only //tools/release reads it (the statically linked tools).
    _maybe(ember_static_archives, "ember_static_archives")
