"""C++ for one .proto file: protoc (and grpc_cpp_plugin) from Debian.

No Bazel proto rules: they would download their toolchains.
"""

def cc_proto(name, proto, imports = [], deps = [], grpc = False, **kwargs):
    """Declares genrule `<proto base>_proto_gen` and cc_library `name`.

    Args:
      name: the cc_library, by convention "<proto base>_cc_proto".
      proto: the .proto file in this package.
      imports: the .proto files it imports (protoc reads them).
      deps: the cc_proto libraries of those imports.
      grpc: also generate and link the gRPC service stubs (links gRPC; without
        it the library links protobuf alone).
      **kwargs: passed to the cc_library (visibility, ...).
    """
    base = proto[:-len(".proto")]
    srcs = [base + ".pb.cc"]
    hdrs = [base + ".pb.h"]
    cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) "
    if grpc:
        srcs.append(base + ".grpc.pb.cc")
        hdrs.append(base + ".grpc.pb.h")
        cmd += ("--grpc_out=$(GENDIR) " +
                "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin ")
    native.genrule(
        name = base + "_proto_gen",
        srcs = [proto] + imports,
        outs = srcs + hdrs,
        cmd = cmd + "$(location %s)" % proto,
    )
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        # Generated code: not ours to fix (and outside .bazelrc's -Werror).
        copts = ["-Wno-unused-parameter"],
        deps = deps + [
            "//third_party/system:grpc" if grpc else "//third_party/system:protobuf",
        ],
        **kwargs
    )
