"""`cuda_configure`: finds the CUDA toolkit and writes the @ember_cuda repository.

Note [Builds with and without CUDA]
Ember builds with or without NVIDIA's CUDA toolkit; which one a build gets is
decided here, once per fetch of @ember_cuda, from two environment variables:

    EMBER_CUDA       unset or "auto": use the toolkit when it is complete,
                     otherwise build without CUDA (and say so once);
                     "1": require it (a missing piece stops the build, named);
                     "0": build without CUDA even where a toolkit is installed.
    EMBER_CUDA_PATH  where the toolkit lives (default /usr/local/cuda under
                     ember_dependencies()' system_root).

Bazel re-runs this rule when either variable changes (`environ`), when its
server starts (`local`), and on `bazel sync --configure` (`configure`), which
is what to run after installing or removing a toolkit at the same path.

The repository it writes holds:
  - defs.bzl: CUDA_ENABLED, CUDA_PATH, CUDA_STATE (a sentence for messages)
    and if_cuda(); tools/cuda.bzl builds its macros on them.
  - the toolkit's targets, `headers`, `cudart`, `cublas`, `cudnn` and `nccl`
    (third_party/cuda aliases them): with CUDA, the toolkit's tree under
    third_party/cuda/local_cuda.BUILD; without, the same names as empty
    libraries that no platform is compatible with, so that `bazel build
    //...` skips every target that needs them (Bazel's incompatible target
    skipping) and building one by name fails, naming the constraint
    `@ember_cuda//:cuda_support` in the dependency chain.
Without CUDA, cuda/ builds its no-device sources (cuda/BUILD.bazel) and the
GPU tests report themselves skipped (tools/cuda.bzl cuda_cc_test).
"""

# What a usable toolkit has, relative to its root. Libraries may be in lib64
# (the runtime, cuBLAS) or lib (NCCL and cuDNN in NVIDIA's packages).
_TOOLKIT_FILES = [
    "bin/nvcc",
    "include/cuda_runtime_api.h",
    "include/cublas_v2.h",
    "include/cudnn.h",
    "include/nccl.h",
]
_TOOLKIT_LIBRARIES = ["cudart", "cublas", "cublasLt", "cudnn", "nccl"]
_TARGETS = ["headers", "cudart", "cublas", "cudnn", "nccl"]

_DEFS = '''"""Written by tools/cuda_configure.bzl (Note [Builds with and without CUDA])."""

# Whether this build compiles Ember's CUDA code (cuda/) against a toolkit.
CUDA_ENABLED = {enabled}

# The toolkit's root ("" without CUDA).
CUDA_PATH = "{path}"

# How the build was configured, in words, for messages.
CUDA_STATE = {state}

def if_cuda(if_true, if_false = []):
    """`if_true` in a build with CUDA, `if_false` in one without."""
    return if_true if CUDA_ENABLED else if_false
'''

def _missing_files(ctx, root):
    missing = [f for f in _TOOLKIT_FILES if not ctx.path(root + "/" + f).exists]
    for lib in _TOOLKIT_LIBRARIES:
        so = "lib%s.so" % lib
        if not ctx.path(root + "/lib64/" + so).exists and not ctx.path(root + "/lib/" + so).exists:
            missing.append("lib64/%s (or lib/%s)" % (so, so))
    return missing

def _write(ctx, enabled, path, state):
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", _DEFS.format(
        enabled = "True" if enabled else "False",
        path = path,
        state = repr(state),
    ))

def _cuda_configure_impl(ctx):
    mode = ctx.os.environ.get("EMBER_CUDA", "auto").strip().lower() or "auto"
    if mode not in ["auto", "0", "1"]:
        fail("EMBER_CUDA is %r; set it to 1 (build with CUDA, require the toolkit), " % mode +
             "0 (build without CUDA) or auto (the default: with CUDA when the toolkit is found)")
    given = ctx.os.environ.get("EMBER_CUDA_PATH", "").strip()
    if given:
        root = given.rstrip("/") or "/"
        where = "EMBER_CUDA_PATH=" + given
    else:
        root = ctx.attr.system_root.rstrip("/") + "/usr/local/cuda"
        where = root
    if mode == "0":
        _write_without(ctx, "EMBER_CUDA=0")
        return
    path = ctx.path(root)
    missing = _missing_files(ctx, root) if path.exists else []
    if path.exists and not missing:
        _write_with(ctx, str(path))
        return
    found = ("no CUDA toolkit at %s" % where) if not path.exists else (
        "the CUDA toolkit at %s lacks %s" % (where, ", ".join(missing))
    )
    if mode == "1":
        fail(("EMBER_CUDA=1 asks for CUDA, but %s. Install NVIDIA's CUDA 13 toolkit " +
              "with cuDNN and NCCL there, point EMBER_CUDA_PATH at one, or unset " +
              "EMBER_CUDA to build without CUDA.") % found)

    # Said once per fetch of this repository (Bazel prints it as DEBUG).
    print(("Building Ember without CUDA support: %s. To build with it, install " +
           "NVIDIA's CUDA 13 toolkit with cuDNN and NCCL in /usr/local/cuda (or " +
           "set EMBER_CUDA_PATH to its root) and run `bazel sync --configure`; " +
           "EMBER_CUDA=0 leaves CUDA out without this note.") % found)
    _write_without(ctx, found)

def _write_with(ctx, root):
    for entry in ctx.path(root).readdir():
        ctx.symlink(entry, entry.basename)
    ctx.template("BUILD.bazel", ctx.attr.build_file, {"%{cuda_path}": root}, executable = False)
    _write(ctx, True, root, "with the CUDA toolkit at " + root)

def _write_without(ctx, why):
    build = [
        "# Written by tools/cuda_configure.bzl: Ember is built without CUDA",
        "# support (%s). The toolkit's targets are empty libraries that no" % why,
        "# platform supports, so `bazel build //...` skips everything that needs",
        "# them (Note [Builds with and without CUDA]).",
        "",
        'package(default_visibility = ["//visibility:public"])',
        "",
        "# No platform has it: what a target that needs CUDA is incompatible with.",
        'constraint_setting(name = "cuda")',
        "",
        "constraint_value(",
        '    name = "cuda_support",',
        '    constraint_setting = ":cuda",',
        ")",
        "",
    ]
    for target in _TARGETS:
        build.append('cc_library(name = "%s", target_compatible_with = [":cuda_support"])\n' % target)
    ctx.file("BUILD.bazel", "\n".join(build))
    _write(ctx, False, "", "without CUDA support (%s)" % why)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    attrs = {
        "system_root": attr.string(default = "/"),
        "build_file": attr.label(mandatory = True),
    },
    environ = ["EMBER_CUDA", "EMBER_CUDA_PATH"],
    configure = True,
    local = True,
)
