"""The layering test: DESIGN.md's arrows, checked over the transitive closure.

Visibility (the package groups of //:BUILD.bazel) makes a wrong-way *direct*
dependency fail the build. These queries add what visibility cannot see: that
no chain of allowed-looking steps leads the wrong way (store/ reaching gRPC
through a proto library, the trainer reaching clients/ through a shared
piece). genquery allows no recursive patterns (//store/...), so every library
and binary of a layer is named here; layering_test.sh fails when a BUILD file
of LAYER_BUILD_FILES declares one that is missing, so a new target cannot slip
past the check unnoticed. A new package joins by adding its BUILD file and
targets below.
"""

# Every cc_library and cc_binary of each layer, by layer.
LAYERS = {
    "proto_messages": [
        "//proto:checkpoint_cc_proto",
        "//proto:plan_cc_proto",
        "//proto:snapshot_cc_proto",
        "//proto:tensor_cc_proto",
        "//proto:tensor_codec",
        "//proto:trainer_config_cc_proto",
    ],
    "store": [
        "//store:checkpoint_chain",
        "//store:delta_store",
        "//store:snapshot_db",
    ],
    "tracker_service": [
        "//tracker_service:delta_tracker_service",
        "//tracker_service:names",
        "//tracker_service:service_host",
        "//tracker_service:service_topology",
        "//tracker_service:step_cuts",
        "//tracker_service:tracker",
        "//tracker_service:tracker_demo",
        "//tracker_service:tracker_metrics",
        "//tracker_service:tracker_server",
        "//tracker_service:tracker_snapshots",
    ],
    "trainer": [
        "//trainer/comm:comm",
        "//trainer/data:data",
        "//trainer/models:architecture_rule",
        "//trainer/models:models",
        "//trainer/modules:modules",
        "//trainer/optim:optim",
        "//trainer/pipeline:pipeline",
        "//trainer/planner:planner",
        "//trainer/planner:planner_lib",
        "//trainer/sharding:sharding",
        "//trainer/sparse:sparse",
        "//trainer/tracking:shard_topology",
        "//trainer/tracking:tracking",
        "//trainer:checkpoint",
        "//trainer:config",
        "//trainer:config_defaults",
        "//trainer:model_verification",
        "//trainer:trainer",
        "//trainer:trainer_lib",
        "//trainer:trainer_metrics",
        "//trainer:verify_model",
    ],
    "clients": [
        "//clients:checkpoint_chain",
        "//clients:checkpoint_job",
        "//clients:checkpoint_job_lib",
        "//clients:checkpoint_job_metrics",
        "//clients:delta_client",
        "//clients:delta_continuity",
        "//clients:deltactl",
        "//clients:fan_in_client",
        "//clients:freshness_window",
        "//clients:npz_file",
        "//clients:predictor",
        "//clients:predictor_lib",
        "//clients:predictor_metrics",
        "//clients:push_json",
        "//clients:replica",
        "//clients:structured_output",
    ],
}

# The BUILD files whose cc_library and cc_binary targets LAYERS must name.
# proto/ is absent on purpose: its service libraries (tracker_cc_proto,
# predictor_cc_proto) link gRPC by design.
LAYER_BUILD_FILES = [
    "//clients:BUILD.bazel",
    "//store:BUILD.bazel",
    "//tracker_service:BUILD.bazel",
    "//trainer:BUILD.bazel",
    "//trainer/comm:BUILD.bazel",
    "//trainer/data:BUILD.bazel",
    "//trainer/models:BUILD.bazel",
    "//trainer/modules:BUILD.bazel",
    "//trainer/optim:BUILD.bazel",
    "//trainer/pipeline:BUILD.bazel",
    "//trainer/planner:BUILD.bazel",
    "//trainer/sharding:BUILD.bazel",
    "//trainer/sparse:BUILD.bazel",
    "//trainer/tracking:BUILD.bazel",
]

# Each check: (layer, regular expression of the labels it must not reach).
CHECKS = {
    "proto_messages_reach_grpc": ("proto_messages", "^//third_party/system:grpc$"),
    "store_reaches_grpc": ("store", "^//third_party/system:grpc$"),
    "store_reaches_upper_layers": ("store", "^//(tracker_service|trainer|clients)[/:]"),
    "tracker_service_reaches_trainer_or_clients": ("tracker_service", "^//(trainer|clients)[/:]"),
    "trainer_reaches_clients": ("trainer", "^//clients[/:]"),
    "clients_reach_trainer_or_tracker": ("clients", "^//(trainer|tracker_service)[/:]|^//store:delta_store$"),
}

# Known wrong-way edges being removed, by check: the targets listed (and what
# they depend on) are not reported. Keep this empty; each entry names its issue.
PENDING = {}

def _set(labels):
    return "set(%s)" % " ".join(labels)

def layering_test(name):
    """Declares one genquery per check and the sh_test that reads them all."""
    queries = []
    for check, (layer, forbidden) in CHECKS.items():
        start = _set(LAYERS[layer])
        targets = 'filter("%s", deps(%s))' % (forbidden, start)
        if check in PENDING:
            targets = "(%s except deps(%s))" % (targets, _set(PENDING[check]))
        native.genquery(
            name = check,
            expression = "somepath(%s, %s)" % (start, targets),
            scope = LAYERS[layer],
            testonly = True,
        )
        queries.append(":" + check)

    declared = []
    for layer in LAYERS.values():
        declared += layer
    native.sh_test(
        name = name,
        size = "small",
        srcs = ["layering_test.sh"],
        args = ["$(location %s)" % q for q in queries] + ["--"] +
               ["$(location %s)" % f for f in LAYER_BUILD_FILES] + ["--"] +
               declared,
        data = queries + LAYER_BUILD_FILES,
    )
