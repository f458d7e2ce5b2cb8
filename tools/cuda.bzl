"""`cuda_library`: compiles .cu sources with nvcc into a cc_library.

    cuda_library(
        name = "scale_kernel",
        srcs = ["scale_kernel.cu"],
        hdrs = ["scale_kernel.h"],
    )

Each .cu becomes an object built for sm_90 (H100/H200) plus compute_90 PTX
(newer GPUs JIT it; nvcc's time grows with every architecture added), with
the host compiler at -O3 and -fPIC. nvcc runs on machines without a GPU, so
CUDA code always builds; only running it needs a device. A .cu file may include its own package's `hdrs`/`textual_hdrs`, Ember
headers listed in `cu_hdrs`, and the CUDA toolkit's headers; host-side C++
that needs wider dependencies belongs in a .cc beside it.
"""

load(":copts.bzl", "EMBER_LINKOPTS")

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

NVCC = "/usr/local/cuda/bin/nvcc"

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
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        linkopts = EMBER_LINKOPTS,
        deps = deps + ["@ember//third_party/cuda:cudart"],
        visibility = visibility,
        **kwargs
    )
