"""Declares every external repository Ember needs, all of them local.

Bazel 4 appends DEFAULT.WORKSPACE.SUFFIX to every WORKSPACE; it declares
http_archive repositories (rules_cc, rules_java, platforms, bazel_skylib,
remote_coverage_tools) that cannot be fetched without a network. Declaring a
local repository under the same name first makes the suffix skip it.

Usage, from Ember's WORKSPACE or from a consumer's:

    load("@ember//tools:repositories.bzl", "ember_dependencies")
    ember_dependencies()
"""

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

def _maybe(rule, name, **kwargs):
    if name not in native.existing_rules():
        rule(name = name, **kwargs)

def ember_dependencies():
    """Declares Ember's external repositories unless the caller already did."""
    _maybe(_rules_cc, "rules_cc")
    _maybe(_coverage_tools, "remote_coverage_tools")
    _maybe(native.local_repository, "rules_java", path = "/usr/share/bazel/rules/java")
    _maybe(native.local_repository, "platforms", path = "/usr/share/bazel/tools/platforms")
    _maybe(native.local_repository, "bazel_skylib", path = "/usr/share/bazel/tools/skylib")
    _maybe(
        native.new_local_repository,
        "local_cuda",
        path = "/usr/local/cuda",
        build_file = "@ember//third_party/cuda:local_cuda.BUILD",
    )
    _maybe(
        native.new_local_repository,
        "local_mpi",
        path = "/usr/lib/x86_64-linux-gnu/openmpi",
        build_file = "@ember//third_party/mpi:local_mpi.BUILD",
    )

    # Only //tools/release reads it (the statically linked tools).
    _maybe(ember_static_archives, "ember_static_archives")
