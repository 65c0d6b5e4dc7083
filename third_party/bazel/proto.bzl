"""deepinfer_proto_library: .proto files -> a cc_library with messages and gRPC stubs.

Runs the system `protoc` and `grpc_cpp_plugin` (Debian protobuf-compiler, protobuf-compiler-grpc)
in a genrule, so no proto toolchain is downloaded. Import paths are relative to the workspace
root, e.g. `import "proto/deepinfer/v1/inference.proto";`, and generated headers are included the
same way: `#include "proto/deepinfer/v1/inference.grpc.pb.h"`.
"""

def deepinfer_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    """Compiles `srcs` (and the protos of `deps`, for imports) into cc_library `name`.

    Args:
      name: the cc_library's name; `<name>_srcs` is a filegroup of the .proto files so that
        other deepinfer_proto_library targets can import them.
      srcs: .proto files in this package.
      deps: other deepinfer_proto_library targets whose protos `srcs` import.
      grpc: also generate gRPC service stubs (.grpc.pb.h/.cc).
      visibility: as usual.
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    dep_srcs = [d + "_srcs" for d in deps]
    pkg = native.package_name()
    pkg_prefix = (pkg + "/") if pkg else ""
    files = " ".join([pkg_prefix + s for s in srcs])
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) "

    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + dep_srcs,
        visibility = visibility,
    )

    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_srcs,
        outs = outs,
        cmd = ("command -v protoc >/dev/null || { echo 'protoc not found: run scripts/setup.sh' >&2; exit 1; }; " +
               "protoc -I. --cpp_out=$(GENDIR) " + grpc_flags + files),
        message = "protoc " + name,
    )

    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + [
            "//third_party:grpc",
            "//third_party:protobuf",
        ],
        # Generated code trips -Wall in places; keep our warnings for our code.
        copts = ["-Wno-unused-parameter", "-Wno-unused-variable"],
        visibility = visibility,
    )
