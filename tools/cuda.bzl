"""Ember's CUDA build rules, for builds with and without CUDA.

`cuda_library` compiles .cu sources with nvcc into a cc_library:

    cuda_library(
        name = "scale_kernel",
        srcs = ["scale_kernel.cu"],
        hdrs = ["scale_kernel.h"],
    )

Each .cu becomes an object built for sm_80 (A100) and sm_90 (H100/H200) plus
compute_90 PTX (newer GPUs JIT it; nvcc's time grows with every architecture added), with
the host compiler at -O3 and -fPIC. nvcc runs on machines without a GPU, so
CUDA code builds wherever the toolkit is; only running it needs a device. A
.cu file may include its own package's `hdrs`/`textual_hdrs`, Ember headers
listed in `cu_hdrs`, and the CUDA toolkit's headers; host-side C++ that needs
wider dependencies belongs in a .cc beside it.

Whether a build has CUDA at all is @ember_cuda's answer (Note [Builds with
and without CUDA] in cuda_configure.bzl). Without it, `cuda_library` targets
are incompatible with every platform (skipped by `bazel build //...`, an
error naming @ember_cuda//:cuda_support when built by name), as is anything
that depends on them or on the toolkit's libraries. Two macros let a package
build either way:

  - cuda_cc_library(name, without_cuda = ":x", ...): the library with CUDA;
    without it, an alias of `without_cuda`, its no-CUDA stand-in (the same
    headers, every call failing as when no device is usable).
  - cuda_cc_test(name, ...): the test with CUDA; without it, a test of the
    same name whose one case reports itself skipped, saying that Ember was
    built without CUDA support (cuda/built_without_cuda_test.cc).
"""

load("@ember_cuda//:defs.bzl", "CUDA_ENABLED", "CUDA_PATH")
load(":copts.bzl", "EMBER_LINKOPTS", "ember_cc_library", "ember_cc_test")

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

NVCC = CUDA_PATH + "/bin/nvcc"

# What a target that needs the CUDA toolkit carries in a build without it.
_WITHOUT_CUDA = [] if CUDA_ENABLED else ["@ember_cuda//:cuda_support"]

def cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [], visibility = None, **kwargs):
    objs = []
    for src in srcs:
        obj = name + "_objs/" + src[:-len(".cu")] + ".o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c",
                "-std=c++20",
                "-O3",
                "-Xcompiler=-fPIC,-O3",
                " ".join(CUDA_ARCH_FLAGS),
                # The workspace root, whether Ember is the main repository or
                # an external one (@ember, under external/ember).
                "-I.",
                "-I$(GENDIR)",
                "-Iexternal/ember",
                "-I$(GENDIR)/external/ember",
                "-o $@",
                "$(location {})".format(src),
            ]),
            message = "nvcc " + src,
            visibility = ["//visibility:private"],
            tags = kwargs.get("tags", []),
            testonly = kwargs.get("testonly", False),
            target_compatible_with = _WITHOUT_CUDA,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        linkopts = EMBER_LINKOPTS,
        deps = deps + ["@ember//third_party/cuda:cudart"],
        visibility = visibility,
        target_compatible_with = _WITHOUT_CUDA,
        **kwargs
    )

def cuda_cc_library(name, without_cuda, **kwargs):
    """ember_cc_library(name, **kwargs) in a build with CUDA; in one without,
    an alias of `without_cuda` (a label in the same package or not)."""
    if CUDA_ENABLED:
        ember_cc_library(name = name, **kwargs)
    else:
        native.alias(name = name, actual = without_cuda, visibility = kwargs.get("visibility"))

def cuda_cc_test(name, rule = ember_cc_test, **kwargs):
    """`rule(name = name, **kwargs)` (an ember_cc_test unless told), tagged
    "gpu" (what tools/gpu_verify.sh bundles), in a build with CUDA; in one
    without, a test of that name that reports itself skipped because Ember
    was built without CUDA support. Keeps `size`, `tags` and `visibility`."""
    if CUDA_ENABLED:
        kwargs["tags"] = kwargs.get("tags", []) + ["gpu"]
        rule(name = name, **kwargs)
        return
    ember_cc_test(
        name = name,
        size = kwargs.get("size", "small"),
        tags = kwargs.get("tags", []),
        visibility = kwargs.get("visibility"),
        deps = ["@ember//cuda:built_without_cuda_test_case"],
    )
