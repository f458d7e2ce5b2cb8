"""Macros of the release build (tools/release/BUILD.bazel)."""

load("//tools:copts.bzl", "ember_cc_binary")

def ember_static_binary(name, deps, **kwargs):
    """A tool linked with every library but glibc static, needing glibc 2.35.

    `deps` are the tool's main library and the *_static variants of the
    third_party libraries it links (tools/release/static_archives.bzl says
    how they turn its -l flags into static links). The object files are the
    ordinary build's: only the link differs.
    """
    ember_cc_binary(
        name = name,
        deps = deps + ["@ember//tools/release:glibc_compat"],
        additional_linker_inputs = ["@ember_static_archives//:archives"],
        **kwargs
    )

def _release_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    ctx.actions.run(
        executable = ctx.executable._package,
        arguments = [
            out.path,
            ctx.file.version.path,
            ctx.file.license.path,
            ctx.file.notices.path,
        ] + [t.path for t in ctx.files.tools],
        inputs = ctx.files.tools + [ctx.file.version, ctx.file.license, ctx.file.notices],
        outputs = [out],
        mnemonic = "EmberRelease",
        progress_message = "Packing the Ember tools release",
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

ember_release = rule(
    implementation = _release_impl,
    doc = """A directory holding ember-tools-<version>-linux-x86_64.tar.gz,
ember-tools_<version>_amd64.deb and their SHA256SUMS (see package.sh). A
directory, because the names carry the version, which Bazel reads only when
it builds (from the VERSION file).""",
    attrs = {
        "tools": attr.label_list(mandatory = True, allow_files = True),
        "version": attr.label(mandatory = True, allow_single_file = True),
        "license": attr.label(mandatory = True, allow_single_file = True),
        # The licences of the libraries linked into the tools.
        "notices": attr.label(mandatory = True, allow_single_file = True),
        "_package": attr.label(
            default = ":package.sh",
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
    },
)
