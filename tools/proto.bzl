"""`ember_grpc_library`: a .proto file into C++ message and gRPC stub targets.

    ember_grpc_library(
        name = "store_proto",
        src = "store.proto",
        grpc = True,   # also generate service stubs (store.grpc.pb.h)
    )

produces `:store_proto`, a cc_library whose headers are `store.pb.h` (and
`store.grpc.pb.h`), included by their workspace path, e.g.
`#include "distributed/store.pb.h"`. It runs Debian's protoc and
grpc_cpp_plugin, so generated code always matches the installed runtime
libraries. A .proto may import siblings in its own package and protobuf's
well-known types.
"""

load(":copts.bzl", "EMBER_COPTS")

def ember_grpc_library(name, src, grpc = True, deps = [], visibility = None, **kwargs):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "protoc --proto_path=$$(dirname $(location {src})) --cpp_out=$(@D)".format(src = src)
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += " --grpc_out=$(@D) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)"
    cmd += " $(location {src})".format(src = src)
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = cmd,
        message = "protoc " + src,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = EMBER_COPTS + ["-Wno-unused-parameter"],
        deps = deps + (["@ember//third_party/grpc"] if grpc else ["@ember//third_party/protobuf"]),
        visibility = visibility,
        **kwargs
    )
