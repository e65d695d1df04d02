"""Offline checks of deploy/: the Kubernetes manifests against a small
structural schema (k8s_schema.yaml) and against each other (Services and
their pods, volumes and claims, probes and ports, grace period and drain,
torchrun environment) and their hardening (non-root pods without privileges,
read-only root file systems, one checkpoint writer, least-privilege tokens,
a pinned image); the Dockerfile (stages, packages, binaries that exist as
Bazel targets, its non-root user) and its build context's .dockerignore;
the systemd units and their sandboxing; the sample trainer configs. Docker
and a cluster cannot run here.
"""

import glob
import os
import re
import shlex
import subprocess
import tempfile
import unittest

import yaml

ROOT = os.path.join(os.environ.get("TEST_SRCDIR", ""),
                    os.environ.get("TEST_WORKSPACE", "__main__"))
if not os.environ.get("TEST_SRCDIR"):
    ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def path(relative: str) -> str:
    return os.path.join(ROOT, relative)


def load_manifests():
    objects = []
    for file in sorted(glob.glob(path("deploy/k8s/*.yaml"))):
        with open(file) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    objects.append((os.path.basename(file), doc))
    return objects


class SchemaChecker:
    """Checks an object against k8s_schema.yaml; collects the errors."""

    def __init__(self, schema):
        self.types = schema["types"]
        self.objects = schema["objects"]
        self.errors = []

    def check_object(self, where, obj):
        key = f"{obj.get('apiVersion')}/{obj.get('kind')}"
        fields = self.objects.get(key)
        if fields is None:
            self.errors.append(f"{where}: no schema for {key}")
            return
        for name, value in obj.items():
            if name in ("apiVersion", "kind"):
                continue
            if name not in fields:
                self.errors.append(f"{where}: unknown field {name}")
                continue
            self.check(f"{where}.{name}", fields[name], value)
        for name in fields:
            if name not in obj and name != "data":
                self.errors.append(f"{where}: missing {name}")

    def check(self, where, type_name, value):
        if type_name.startswith("list:"):
            if not isinstance(value, list):
                self.errors.append(f"{where}: expected a list")
                return
            for i, item in enumerate(value):
                self.check(f"{where}[{i}]", type_name[5:], item)
            return
        simple = {"str": str, "bool": bool, "int": int}
        if type_name in simple:
            ok = isinstance(value, simple[type_name]) and not (
                type_name == "int" and isinstance(value, bool))
            if not ok:
                self.errors.append(f"{where}: expected {type_name}, got "
                                   f"{value!r}")
            return
        if type_name == "int_or_str":
            if not isinstance(value, (int, str)):
                self.errors.append(f"{where}: expected int or str")
            return
        if type_name == "map":
            if not isinstance(value, dict) or not all(
                    isinstance(v, str) for v in value.values()):
                self.errors.append(f"{where}: expected a map of strings")
            return
        spec = self.types[type_name]
        if not isinstance(value, dict):
            self.errors.append(f"{where}: expected {type_name}")
            return
        for name, item in value.items():
            if name not in spec["fields"]:
                self.errors.append(f"{where}: unknown field {name} in "
                                   f"{type_name}")
            else:
                self.check(f"{where}.{name}", spec["fields"][name], item)
        for name in spec.get("required", []):
            if name not in value:
                self.errors.append(f"{where}: {type_name} needs {name}")


WORKLOAD_KINDS = ("Job", "Deployment", "StatefulSet")


def pod_specs(objects):
    """(object name, pod template) of every workload (Job, Deployment,
    StatefulSet)."""
    return [(o["metadata"]["name"], o["spec"]["template"]) for _, o in objects
            if o["kind"] in WORKLOAD_KINDS]


# Flags whose value is a path the binary writes (a directory or a file).
WRITTEN_PATH_FLAGS = ("--checkpoint_dir", "--dir", "--db", "--replica_db",
                      "--apply_log")


def flag_values(args, flag):
    return [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]


def written_paths(args):
    return [v for flag in WRITTEN_PATH_FLAGS for v in flag_values(args, flag)]


def under(path_, directory):
    directory = directory.rstrip("/")
    return path_ == directory or path_.startswith(directory + "/")


def trainer_config_text(objects):
    return next(o for _, o in objects if o["kind"] == "ConfigMap" and
                o["metadata"]["name"] == "deltastream-trainer")["data"][
                    "trainer.textproto"]


def config_drain(objects):
    return int(re.search(r"drain_seconds:\s*(\d+)",
                         trainer_config_text(objects)).group(1))


# Which workload may mount each Secret, and why (docs/deploy.md). The
# tracker's token file holds every token (operators' admin ones too): the
# trainer, which serves the tracker, only. The predictor sends an admin token
# (each pod adds its own consumer: AddConsumer is an admin call) and holds
# its lookup API's own token file; the checkpoint job a token of role
# "consumer checkpoint" (its consumer is declared in the trainer's config).
SECRET_USERS = {
    "deltastream-tracker-auth": "deltastream-trainer",
    "deltastream-tls": "deltastream-trainer",
    "deltastream-predictor-auth": "deltastream-predictor",
    "deltastream-checkpoint-auth": "deltastream-checkpoint",
}


class ManifestsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.objects = load_manifests()
        cls.by_kind = {}
        for _, o in cls.objects:
            cls.by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o

    def test_every_object_matches_the_schema(self):
        with open(path("tests/deploy/k8s_schema.yaml")) as f:
            checker = SchemaChecker(yaml.safe_load(f))
        self.assertGreaterEqual(len(self.objects), 10)
        for file, obj in self.objects:
            checker.check_object(f"{file}:{obj.get('kind')}/"
                                 f"{obj.get('metadata', {}).get('name')}", obj)
        self.assertEqual(checker.errors, [])

    def test_the_schema_catches_mistakes(self):
        with open(path("tests/deploy/k8s_schema.yaml")) as f:
            checker = SchemaChecker(yaml.safe_load(f))
        job = yaml.safe_load(yaml.safe_dump(self.by_kind["Job"][
            "deltastream-trainer"]))
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["imagePullPolic"] = 1
        job["spec"]["completions"] = "2"
        container["securityContext"]["allowPrivilegeEscalaton"] = False
        job["spec"]["template"]["spec"]["securityContext"][
            "runAsNonRoot"] = "true"
        checker.check_object("job", job)
        self.assertEqual(len(checker.errors), 4, checker.errors)
        statefulset = yaml.safe_load(yaml.safe_dump(self.by_kind[
            "StatefulSet"]["deltastream-checkpoint"]))
        del statefulset["spec"]["serviceName"]
        tmp = next(v for v in statefulset["spec"]["template"]["spec"][
            "volumes"] if "emptyDir" in v)
        tmp["emptyDir"] = {"sizeLimt": "1Gi"}
        checker.errors = []
        checker.check_object("statefulset", statefulset)
        self.assertEqual(len(checker.errors), 2, checker.errors)

    def test_services_select_pods_and_name_their_ports(self):
        for name, service in self.by_kind["Service"].items():
            selector = service["spec"]["selector"]
            matches = []
            for _, template in pod_specs(self.objects):
                labels = dict(template["metadata"]["labels"])
                # Indexed Jobs label their pods with the completion index.
                labels.setdefault("batch.kubernetes.io/job-completion-index",
                                  "0")
                if all(labels.get(k) == v for k, v in selector.items()):
                    matches.append(template)
            self.assertEqual(len(matches), 1, name)
            ports = {p["name"]: p["containerPort"] for c in
                     matches[0]["spec"]["containers"] for p in c["ports"]}
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                if isinstance(target, str):
                    self.assertIn(target, ports, name)
                else:
                    self.assertIn(target, ports.values(), name)

    def test_trainer_is_an_indexed_job_with_rendezvous(self):
        job = self.by_kind["Job"]["deltastream-trainer"]
        spec = job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        self.assertEqual(spec["completions"], spec["parallelism"])
        pod = spec["template"]["spec"]
        headless = self.by_kind["Service"][pod["subdomain"]]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        self.assertEqual(
            env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        self.assertEqual(env["WORLD_SIZE"]["value"], str(spec["completions"]))
        self.assertEqual(env["MASTER_ADDR"]["value"],
                         f"{job['metadata']['name']}-0.{pod['subdomain']}")
        ports = {p["name"]: p["containerPort"]
                 for p in pod["containers"][0]["ports"]}
        self.assertEqual(int(env["MASTER_PORT"]["value"]), ports["rendezvous"])
        for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            self.assertIn(name, env)
        # One checkpoint directory for every rank (sharded checkpoints), on
        # a volume every pod mounts.
        args = pod["containers"][0]["args"]
        self.assertIn("--checkpoint_dir=/var/lib/deltastream/run", args)
        self.assertNotIn("$(RANK)", " ".join(args))

    def test_a_stopped_trainer_resumes_and_a_refused_one_fails(self):
        # A stop (eviction, drain) must not complete the index: the trainer
        # exits with its stopped code, which the Job ignores (a new pod
        # resumes), and so does a rank that failed only because another
        # did (its peer failure code: one crash counts once against
        # backoffLimit); a refused config (exit 2) fails the Job.
        spec = self.by_kind["Job"]["deltastream-trainer"]["spec"]
        pod = spec["template"]["spec"]
        self.assertEqual(pod["restartPolicy"], "Never")  # the policy's
        container = pod["containers"][0]

        def code_of(flag):
            codes = [int(a.split("=", 1)[1]) for a in container["args"]
                     if a.startswith(flag + "=")]
            self.assertEqual(len(codes), 1, flag)
            return codes[0]

        stopped = code_of("--stopped_exit_code")
        peer_failure = code_of("--peer_failure_exit_code")
        self.assertNotEqual(stopped, peer_failure)
        actions = {}
        for rule in spec["podFailurePolicy"]["rules"]:
            on = rule.get("onExitCodes")
            if on is None:
                continue
            self.assertEqual(on["containerName"], container["name"])
            self.assertEqual(on["operator"], "In")
            for code in on["values"]:
                actions[code] = rule["action"]
        self.assertEqual(actions.get(stopped), "Ignore")
        self.assertEqual(actions.get(peer_failure), "Ignore")
        # A crash of the rank at fault (1, or 128 + a signal) counts.
        for counted in (1, 137):
            self.assertNotIn(counted, actions)
        self.assertEqual(actions.get(2), "FailJob")
        self.assertIn({"type": "DisruptionTarget"},
                      [c for r in spec["podFailurePolicy"]["rules"]
                       for c in r.get("onPodConditions", [])])

    def test_trainer_config_parses_as_a_trainer_config(self):
        # protoc --encode parses text format against the real message: an
        # unknown or misspelt field fails, as it would in the trainer.
        config = self.by_kind["ConfigMap"]["deltastream-trainer"]["data"][
            "trainer.textproto"]
        result = subprocess.run(
            ["/usr/bin/protoc", f"--proto_path={ROOT}",
             "--encode=deltastream.v1.TrainerConfig",
             "proto/trainer_config.proto"],
            input=config.encode(), capture_output=True, timeout=30)
        self.assertEqual(result.returncode, 0, result.stderr.decode())
        bad = subprocess.run(
            ["/usr/bin/protoc", f"--proto_path={ROOT}",
             "--encode=deltastream.v1.TrainerConfig",
             "proto/trainer_config.proto"],
            input=b"tracker { drain_secs: 1 }", capture_output=True,
            timeout=30)
        self.assertNotEqual(bad.returncode, 0)

    def test_grace_period_exceeds_the_drain(self):
        config = self.by_kind["ConfigMap"]["deltastream-trainer"]["data"][
            "trainer.textproto"]
        drain = int(re.search(r"drain_seconds:\s*(\d+)", config).group(1))
        pod = self.by_kind["Job"]["deltastream-trainer"]["spec"]["template"][
            "spec"]
        self.assertGreater(pod["terminationGracePeriodSeconds"], drain + 30)

    def test_probes_volumes_secrets_and_scrape_annotations(self):
        claims = set(self.by_kind["PersistentVolumeClaim"])
        configs = set(self.by_kind["ConfigMap"])
        config = self.by_kind["ConfigMap"]["deltastream-trainer"]["data"][
            "trainer.textproto"]
        tls = re.search(r"^\s*tls_cert:", config, re.M) is not None
        used_claims = set()
        for name, template in pod_specs(self.objects):
            annotations = template["metadata"]["annotations"]
            self.assertEqual(annotations["prometheus.io/scrape"], "true", name)
            pod = template["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            for container in pod["containers"]:
                ports = {p["containerPort"] for p in container["ports"]}
                self.assertIn(int(annotations["prometheus.io/port"]), ports)
                for probe in ("startupProbe", "readinessProbe",
                              "livenessProbe"):
                    if probe not in container:
                        continue
                    action = container[probe]
                    port = (action.get("grpc") or action.get("tcpSocket"))[
                        "port"]
                    self.assertIn(port, ports, f"{name} {probe}")
                    if tls and name == "deltastream-trainer":
                        self.assertNotIn("grpc", action,
                                         "kubelet gRPC probes are plaintext")
                listen = [a for a in container.get("args", [])
                          if a.startswith("--listen=")]
                for arg in listen:
                    self.assertIn(int(arg.rsplit(":", 1)[1]), ports, name)
                for mount in container["volumeMounts"]:
                    self.assertIn(mount["name"], volumes, name)
            for volume in volumes.values():
                if "persistentVolumeClaim" in volume:
                    claim = volume["persistentVolumeClaim"]["claimName"]
                    self.assertIn(claim, claims, name)
                    used_claims.add(claim)
                if "configMap" in volume:
                    self.assertIn(volume["configMap"]["name"], configs)
                if "secret" in volume:
                    self.assertIn(volume["secret"]["secretName"],
                                  SECRET_USERS)
            has_grpc_probe = any("grpc" in c.get(p, {})
                                 for c in pod["containers"]
                                 for p in ("readinessProbe",))
            if name in ("deltastream-trainer", "deltastream-predictor"):
                self.assertTrue(has_grpc_probe, name)
        self.assertEqual(used_claims, claims)  # no claim left unused

    def test_pods_run_as_non_root_without_privileges(self):
        # Every pod: a numeric non-root user and group (the image's, see
        # DockerfileTest), the runtime's default seccomp profile, no service
        # account token; every container: no privilege escalation, no
        # capability, a read-only root file system.
        for name, template in pod_specs(self.objects):
            pod = template["spec"]
            self.assertIs(pod.get("automountServiceAccountToken"), False, name)
            context = pod.get("securityContext", {})
            self.assertIs(context.get("runAsNonRoot"), True, name)
            for field in ("runAsUser", "runAsGroup", "fsGroup"):
                self.assertIsInstance(context.get(field), int, name)
                self.assertGreater(context[field], 0, f"{name} {field}")
            self.assertEqual(context.get("seccompProfile"),
                             {"type": "RuntimeDefault"}, name)
            for container in pod["containers"]:
                where = f"{name}/{container['name']}"
                security = container.get("securityContext", {})
                self.assertIs(security.get("allowPrivilegeEscalation"), False,
                              where)
                self.assertIs(security.get("readOnlyRootFilesystem"), True,
                              where)
                self.assertNotIn("privileged", security, where)
                self.assertEqual(security.get("capabilities"),
                                 {"drop": ["ALL"]}, where)
                for field in ("runAsUser", "runAsGroup"):  # the pod's only
                    self.assertNotIn(field, security, where)

    def test_written_paths_are_writable_volumes(self):
        # With a read-only root file system, every path a binary writes (its
        # directory and file flags, and /tmp for the libraries) must lie on
        # a writable volume: an emptyDir or a claim, mounted read-write.
        for name, template in pod_specs(self.objects):
            pod = template["spec"]
            volumes = {v["name"]: v for v in pod["volumes"]}
            for container in pod["containers"]:
                mounts = sorted(container["volumeMounts"],
                                key=lambda m: len(m["mountPath"]))
                paths = written_paths(container.get("args", [])) + ["/tmp"]
                for written in paths:
                    mount = [m for m in mounts
                             if under(written, m["mountPath"])]
                    self.assertTrue(mount, f"{name}: {written} is on the "
                                    "read-only root file system")
                    mount = mount[-1]  # the innermost
                    self.assertFalse(mount.get("readOnly", False),
                                     f"{name}: {written}")
                    volume = volumes[mount["name"]]
                    self.assertTrue("emptyDir" in volume or
                                    "persistentVolumeClaim" in volume,
                                    f"{name}: {written}")
                    if "emptyDir" in volume:  # bounded: no node disk filled
                        self.assertIn("sizeLimit", volume["emptyDir"],
                                      f"{name}: {written}")

    def test_the_checkpoint_job_cannot_run_two_pods(self):
        # Two writers on one chain (and one consumer) must be impossible: a
        # Deployment replaces an evicted or unreachable pod at once, while it
        # may still run. A StatefulSet of one replica makes the next pod only
        # once the previous one is gone.
        workloads = [o for _, o in self.objects
                     if o["kind"] in WORKLOAD_KINDS and
                     o["spec"]["template"]["spec"]["containers"][0][
                         "command"][0] == "checkpoint_job"]
        self.assertEqual(len(workloads), 1)
        workload = workloads[0]
        self.assertEqual(workload["kind"], "StatefulSet")
        spec = workload["spec"]
        self.assertEqual(spec["replicas"], 1)
        self.assertEqual(spec.get("podManagementPolicy", "OrderedReady"),
                         "OrderedReady")
        strategy = spec.get("updateStrategy", {})
        self.assertEqual(strategy.get("type", "RollingUpdate"),
                         "RollingUpdate")
        self.assertNotIn("maxUnavailable", strategy.get("rollingUpdate", {}))
        service = self.by_kind["Service"][spec["serviceName"]]
        self.assertEqual(service["spec"]["clusterIP"], "None")
        # Nothing else writes its chain.
        claims = {v["persistentVolumeClaim"]["claimName"]
                  for v in spec["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v}
        for name, template in pod_specs(self.objects):
            if name == workload["metadata"]["name"]:
                continue
            for volume in template["spec"]["volumes"]:
                if "persistentVolumeClaim" in volume:
                    self.assertNotIn(
                        volume["persistentVolumeClaim"]["claimName"], claims,
                        name)

    def test_each_workload_mounts_only_the_tokens_it_needs(self):
        # Only the trainer mounts the tracker's token file (every token,
        # admin ones among them); the predictor its own Secret (an admin
        # token: it adds its consumer; its lookup API's token file); the
        # checkpoint job a Secret of its own with a consumer token, which
        # cannot add a consumer: the trainer's config declares its.
        mounted_by = {}
        for name, template in pod_specs(self.objects):
            pod = template["spec"]
            secrets = {v["name"]: v["secret"]["secretName"]
                       for v in pod["volumes"] if "secret" in v}
            for secret in secrets.values():
                self.assertEqual(SECRET_USERS.get(secret), name,
                                 f"{name} mounts {secret}")
                mounted_by.setdefault(secret, set()).add(name)
            for container in pod["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        self.assertEqual(SECRET_USERS.get(ref["name"]), name,
                                         f"{name} reads {ref['name']}")
                # Token files come from the workload's own Secret.
                mounts = {m["mountPath"]: secrets.get(m["name"])
                          for m in container["volumeMounts"]}
                args = container.get("args", [])
                for flag in ("--token_file", "--auth_token_file"):
                    for file in flag_values(args, flag):
                        owner = [s for p, s in mounts.items()
                                 if s and under(file, p)]
                        self.assertEqual(len(owner), 1, f"{name} {file}")
                        self.assertEqual(SECRET_USERS[owner[0]], name)
                        self.assertNotEqual(owner[0],
                                            "deltastream-tracker-auth",
                                            f"{name}: {flag} is the "
                                            "tracker's token file")
        self.assertEqual(mounted_by.get("deltastream-tracker-auth"),
                         {"deltastream-trainer"})
        # The tracker's token file is the tracker Secret's.
        config = trainer_config_text(self.objects)
        tokens = re.search(r'auth_token_file:\s*"([^"]+)"', config).group(1)
        trainer = self.by_kind["Job"]["deltastream-trainer"]["spec"][
            "template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"]
                   for v in trainer["volumes"] if "secret" in v}
        self.assertIn("deltastream-tracker-auth",
                      [secrets.get(m["name"]) for m in
                       trainer["containers"][0]["volumeMounts"]
                       if under(tokens, m["mountPath"])])
        # The checkpoint job's consumer token cannot add its consumer: the
        # trainer declares it.
        job = self.by_kind["StatefulSet"]["deltastream-checkpoint"]["spec"][
            "template"]["spec"]["containers"][0]
        consumer = flag_values(job["args"], "--consumer")
        declared = re.findall(r'consumers:\s*"([^"]+)"', config)
        self.assertEqual(len(consumer), 1)
        self.assertIn(consumer[0], declared)

    def test_images_name_one_pinned_version(self):
        # One image, at an explicit version (never a moving tag such as
        # dev or latest), as the Dockerfile's build line tags it; a digest
        # may follow.
        images = {c["image"] for _, t in pod_specs(self.objects)
                  for c in t["spec"]["containers"]}
        self.assertEqual(len(images), 1, images)
        image = images.pop()
        match = re.fullmatch(
            r"(?P<name>[a-z0-9][a-z0-9._/:-]*?):(?P<tag>[\w][\w.-]*)"
            r"(?P<digest>@sha256:[0-9a-f]{64})?", image)
        self.assertIsNotNone(match, image)
        self.assertRegex(match["tag"], r"^v?\d+\.\d+\.\d+([-+.][\w.]+)?$")
        with open(path("deploy/Dockerfile")) as f:
            built = re.findall(r"docker build .*-t (\S+)", f.read())
        self.assertEqual(set(built), {f"{match['name']}:{match['tag']}"})

    def test_commands_are_binaries_of_the_image_and_take_their_flags(self):
        binaries = dockerfile_binaries()
        for name, template in pod_specs(self.objects):
            for container in template["spec"]["containers"]:
                binary = container["command"][0]
                self.assertIn(binary, binaries, name)
                self.assertEqual(
                    unknown_flags(BINARY_PATHS[binary], container["args"]),
                    set(), name)


def unknown_flags(binary, args):
    """The flags `binary` refuses among `args` ($(VAR) references replaced
    by 0). A probe flag goes last: a binary that accepts everything else
    names only it, and exits without starting."""
    args = [re.sub(r"\$\(\w+\)", "0", a) for a in args]
    result = subprocess.run([path(binary)] + args + ["--zzz_deploy_probe=1"],
                            capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    names = set(re.findall(r"Unknown command line flag '(\w+)'", output))
    names |= set(re.findall(r"unknown flag --(\w+)", output))
    # Some binaries stop at the first unknown flag: another name is enough.
    if not names:
        raise AssertionError(f"{binary} did not refuse the probe flag: "
                             f"{output[-500:]}")
    return names - {"zzz_deploy_probe"}


BINARY_PATHS = {"trainer": "trainer/trainer",
                "verify_model": "trainer/verify_model",
                "tracker_server": "tracker_service/tracker_server",
                "predictor": "clients/predictor",
                "checkpoint_job": "clients/checkpoint_job",
                "deltactl": "clients/deltactl"}


def dockerfile_binaries():
    """Binary names the image installs (copied from bazel-bin)."""
    with open(path("deploy/Dockerfile")) as f:
        text = f.read()
    return {os.path.basename(p) for p in
            re.findall(r"bazel-bin/(\S+)", text)}


class DockerfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(path("deploy/Dockerfile")) as f:
            cls.text = f.read()
        # Continuation lines joined: one instruction per entry.
        cls.instructions = [
            line.strip() for line in
            re.sub(r"\\\n", " ", cls.text).splitlines()
            if line.strip() and not line.strip().startswith("#")]

    def test_two_stages_from_debian(self):
        froms = [i.split() for i in self.instructions if i.startswith("FROM")]
        self.assertEqual([f[1] for f in froms],
                         ["debian:bookworm", "debian:bookworm-slim"])
        self.assertEqual([f[3] for f in froms], ["build", "runtime"])
        self.assertTrue(any(i.startswith("COPY --from=build /out/ ")
                            for i in self.instructions))

    def test_build_stage_installs_with_install_deps(self):
        self.assertIn("bash /tmp/install-deps.sh", self.text)
        self.assertTrue(os.path.exists(path("deploy/install-deps.sh")))

    def test_runtime_packages_exist_and_come_with_the_build_packages(self):
        with open(path("deploy/install-deps.sh")) as f:
            deps = f.read()
        build_packages = re.search(r"PACKAGES=\((.*?)\)", deps, re.S).group(1)
        build_packages = [p for line in build_packages.splitlines()
                          for p in line.split("#")[0].split()]
        self.assertIn("libtorch-dev", build_packages)
        runtime = re.search(r"AS runtime.*?install -y -qq --no-install-recommends"
                            r"(.*?)&&", re.sub(r"\\\n", " ", self.text),
                            re.S).group(1).split()
        self.assertIn("libtorch1.13", runtime)
        # Each runtime package is installed here, where install-deps.sh ran:
        # the -dev packages depend on them (same Debian release as the image).
        for package in runtime:
            result = subprocess.run(
                ["dpkg-query", "-W", "-f=${Status}", package],
                capture_output=True, text=True)
            self.assertIn("install ok installed", result.stdout, package)

    def test_copied_binaries_are_the_built_bazel_targets(self):
        build = next(i for i in self.instructions
                     if i.startswith("RUN bazel build"))
        targets = [w for w in shlex.split(build) if w.startswith("//")]
        copied = re.findall(r"bazel-bin/(\S+)", build)
        self.assertEqual(len(targets), len(copied))
        for target, binary in zip(targets, copied):
            package, name = target[2:].split(":")
            self.assertEqual(binary, f"{package}/{name}")
            # The test depends on these targets: they build and are here.
            self.assertTrue(os.access(path(binary), os.X_OK), binary)

    def test_runtime_runs_as_the_pods_numeric_non_root_user(self):
        # The runtime stage makes a user and group of fixed ids, owns its
        # working directory to them, and runs as them by number (a runtime
        # can tell a number is not root; runAsNonRoot needs that), the ids
        # every pod's securityContext names.
        runtime = self.instructions[next(
            i for i, line in enumerate(self.instructions)
            if line.startswith("FROM") and line.endswith("AS runtime")):]
        users = [i.split()[1] for i in runtime if i.startswith("USER ")]
        self.assertEqual(len(users), 1, users)
        match = re.fullmatch(r"(\d+):(\d+)", users[0])
        self.assertIsNotNone(match, f"USER {users[0]}: not uid:gid numbers")
        uid, gid = int(match.group(1)), int(match.group(2))
        self.assertGreater(uid, 0)
        self.assertGreater(gid, 0)
        run = " ".join(i for i in runtime if i.startswith("RUN "))
        self.assertRegex(run, rf"groupadd [^&]*--gid {gid} deltastream")
        self.assertRegex(run, rf"useradd [^&]*--uid {uid} [^&]*--gid {gid} ")
        workdir = [i.split()[1] for i in runtime if i.startswith("WORKDIR ")]
        self.assertEqual(len(workdir), 1)
        self.assertIn(f"chown {uid}:{gid} {workdir[0]}", run)
        for name, template in pod_specs(load_manifests()):
            context = template["spec"].get("securityContext", {})
            self.assertEqual(
                (context.get("runAsUser"), context.get("runAsGroup"),
                 context.get("fsGroup")), (uid, gid, gid), name)


def dockerignore_patterns(text):
    """(negated, regex) of each pattern of a .dockerignore, in order, as
    Docker reads them (moby/patternmatcher): relative to the context root,
    * and ? within one path element, ** across elements, ! an exception;
    a pattern that matches a directory excludes what is under it."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex, i = "", 0
        while i < len(line):
            if line.startswith("**/", i):
                regex, i = regex + "(.*/)?", i + 3
            elif line.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif line[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif line[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(line[i]), i + 1
        patterns.append((negated, re.compile(regex)))
    return patterns


def dockerignored(patterns, relative):
    """Whether Docker leaves `relative` (a file's path in the context) out."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for negated, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negated
    return excluded


def dockerignore_file():
    """The build context's .dockerignore (//:.dockerignore, a runfile)."""
    return path(".dockerignore")


class DockerignoreTest(unittest.TestCase):
    """The build context is the repository root (docker build -f
    deploy/Dockerfile .): .dockerignore must keep what the build reads and
    leave out build outputs, VCS data and local artefacts."""

    def test_dockerignore_keeps_the_sources_and_drops_the_rest(self):
        file = dockerignore_file()
        self.assertTrue(os.path.exists(file), f"no {file}")
        with open(file) as f:
            patterns = dockerignore_patterns(f.read())
        with open(path("deploy/Dockerfile")) as f:
            dockerfile = re.sub(r"\\\n", " ", f.read())
        # What the Dockerfile copies from the context by name, and what the
        # Bazel build in it reads: the workspace, the packages of its
        # targets, the local repositories the WORKSPACE points at.
        needed = ["WORKSPACE", ".bazelrc", "BUILD.bazel",
                  "third_party/bazel/rules_cc/defs.bzl",
                  "proto/trainer_config.proto", "deploy/BUILD.bazel"]
        for line in dockerfile.splitlines():
            words = line.split()
            if words[:1] == ["COPY"] and not any(
                    w.startswith("--from") for w in words):
                for source in words[1:-1]:
                    source = source.rstrip("/")
                    if source == ".":
                        continue
                    if os.path.isdir(path(source)):
                        needed += [os.path.relpath(p, ROOT) for p in
                                   glob.glob(path(source + "/*"))]
                    else:
                        needed.append(source)
        for target in re.findall(r"//(\w+):", dockerfile):
            needed.append(f"{target}/BUILD.bazel")
        self.assertIn("deploy/install-deps.sh", needed)
        self.assertIn("deploy/configs/criteo.textproto", needed)
        for relative in needed:
            self.assertFalse(dockerignored(patterns, relative), relative)
        for relative in (".git/HEAD", "bazel-bin/trainer/trainer",
                         "bazel-out/k8-opt/bin/x", "bazel-main/WORKSPACE",
                         "bazel-testlogs/tests/deploy/test.log",
                         "build/CMakeCache.txt", "build-asan/trainer",
                         ".debs/libtorch-dev.deb", "trainer.log",
                         "tests/integration/run.log", ".cache/bazel/x",
                         "clients/python/deltastream/__pycache__/a.pyc"):
            self.assertTrue(dockerignored(patterns, relative), relative)

    def test_the_matcher_reads_patterns_as_docker(self):
        patterns = dockerignore_patterns(
            "# c\n/bazel-*\n**/*.log\nbuild\n!build/keep\n")
        self.assertTrue(dockerignored(patterns, "bazel-out/a/b"))
        self.assertFalse(dockerignored(patterns, "x/bazel-out"))
        self.assertTrue(dockerignored(patterns, "a.log"))
        self.assertTrue(dockerignored(patterns, "a/b/c.log"))
        self.assertTrue(dockerignored(patterns, "build/x"))
        self.assertFalse(dockerignored(patterns, "build/keep"))
        self.assertFalse(dockerignored(patterns, "trainer/build.cc"))


def parse_unit(file):
    """A systemd unit file as {section: {key: [values]}} (a key may repeat,
    as systemd allows; '#' and ';' start comments)."""
    sections, current = {}, None
    with open(file) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], {})
                continue
            if current is None or "=" not in line:
                raise AssertionError(f"{file}:{number}: not key=value "
                                     f"in a section: {line}")
            key, value = line.split("=", 1)
            current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_files():
    return sorted(glob.glob(path("deploy/systemd/*.service")))


# Sandboxing every unit has (systemd.exec(5)); docs/deploy.md says why.
UNIT_HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "CapabilityBoundingSet": "",
    "SystemCallArchitectures": "native",
}


class SystemdTest(unittest.TestCase):

    def test_units_parse_and_run_binaries_of_the_image(self):
        binaries = dockerfile_binaries()
        units = unit_files()
        self.assertEqual(len(units), 4)
        for unit in units:
            sections = parse_unit(unit)
            self.assertEqual(set(sections), {"Unit", "Service", "Install"},
                             unit)
            service = sections["Service"]
            for key, values in service.items():
                if key not in ("SystemCallFilter", "ReadWritePaths",
                               "ReadOnlyPaths", "InaccessiblePaths"):
                    self.assertEqual(len(values), 1, f"{unit}: {key}")
            command = shlex.split(service["ExecStart"][0])
            self.assertTrue(command[0].startswith("/usr/local/bin/"), unit)
            self.assertIn(os.path.basename(command[0]), binaries, unit)
            args = [a.replace("%i", "2") for a in command[1:]]
            self.assertEqual(unknown_flags(
                BINARY_PATHS[os.path.basename(command[0])], args), set(), unit)
            self.assertIn("TimeoutStopSec", service, unit)
            self.assertEqual(service["User"], ["deltastream"], unit)

    def test_units_are_sandboxed_and_write_only_their_state(self):
        for unit in unit_files():
            service = parse_unit(unit)["Service"]
            for key, value in UNIT_HARDENING.items():
                self.assertEqual(service.get(key), [value], f"{unit}: {key}")
            self.assertNotIn("AmbientCapabilities", [
                k for k, v in service.items() if v != [""]], unit)
            # IP and Unix sockets; netlink for the trainer only (Gloo and
            # NCCL list interfaces).
            families = set(service["RestrictAddressFamilies"][0].split())
            allowed = {"AF_INET", "AF_INET6", "AF_UNIX"}
            if unit.endswith("deltastream-trainer.service"):
                allowed.add("AF_NETLINK")
            self.assertLessEqual(families, allowed, unit)
            self.assertLessEqual({"AF_INET", "AF_UNIX"}, families, unit)
            self.assertIn("@system-service", service["SystemCallFilter"],
                          unit)
            self.assertNotEqual(service.get("DynamicUser"), ["yes"], unit)
            # ProtectSystem=strict: what the binary writes (its directory
            # flags, its working directory's files) must be a state
            # directory of the unit or one of its ReadWritePaths.
            writable = ["/var/lib/" + d.replace("%i", "2")
                        for v in service.get("StateDirectory", [])
                        for d in v.split()]
            writable += [p.replace("%i", "2").lstrip("-")
                         for v in service.get("ReadWritePaths", [])
                         for p in v.split()]
            self.assertTrue(writable, unit)
            args = [a.replace("%i", "2")
                    for a in shlex.split(service["ExecStart"][0])[1:]]
            written = written_paths(args)
            self.assertTrue(written, unit)
            written += service.get("WorkingDirectory", [])
            for file in written:
                self.assertTrue(any(under(file, w) for w in writable),
                                f"{unit}: {file} is read-only")

    def test_trainer_unit_drains_as_the_kubernetes_trainer(self):
        # The same drain as deploy/k8s's (--drain_s, whatever config is
        # installed), a stop timeout that exceeds it by as much as the pod's
        # grace period does, and SIGTERM to the main process only: with
        # --nproc_per_node its launcher forwards it, and a rank signalled
        # twice would exit at once.
        service = parse_unit(path(
            "deploy/systemd/deltastream-trainer.service"))["Service"]
        args = shlex.split(service["ExecStart"][0])[1:]
        drain = flag_values(args, "--drain_s")
        self.assertEqual(len(drain), 1, "the trainer unit sets no drain")
        objects = load_manifests()
        self.assertEqual(float(drain[0]), config_drain(objects))
        timeout = int(service["TimeoutStopSec"][0])
        self.assertGreater(timeout, float(drain[0]) + 30)
        grace = next(o for _, o in objects if o["kind"] == "Job")["spec"][
            "template"]["spec"]["terminationGracePeriodSeconds"]
        self.assertEqual(timeout, grace)
        self.assertEqual(service["KillSignal"], ["SIGTERM"])
        self.assertEqual(service.get("KillMode"), ["mixed"])

    @unittest.skipUnless(os.access("/usr/bin/systemd-analyze", os.X_OK),
                         "no systemd-analyze")
    def test_systemd_accepts_the_units_and_rates_them_hardened(self):
        # systemd itself reads each unit (an unknown or misspelt setting,
        # a bad value) and scores its exposure offline (0 safest, 10 none
        # of its sandboxing): at most 2.5 ("OK"); the units without
        # sandboxing scored 9.2.
        with tempfile.TemporaryDirectory(
                dir=os.environ.get("TEST_TMPDIR")) as root:
            units_dir = os.path.join(root, "etc/systemd/system")
            bin_dir = os.path.join(root, "usr/local/bin")
            os.makedirs(units_dir)
            os.makedirs(bin_dir)
            for binary in BINARY_PATHS:
                fake = os.path.join(bin_dir, binary)
                with open(fake, "w") as f:
                    f.write("#!/bin/sh\n")
                os.chmod(fake, 0o755)
            names = []
            for unit in unit_files():
                name = os.path.basename(unit)
                with open(unit) as f, open(os.path.join(units_dir, name),
                                           "w") as out:
                    out.write(f.read())
                names.append(name.replace("@.service", "@2.service"))
            for name in names:
                verify = subprocess.run(
                    ["/usr/bin/systemd-analyze", "verify", "--man=no",
                     f"--root={root}", name],
                    capture_output=True, text=True, timeout=60)
                complaints = [
                    line for line in (verify.stdout + verify.stderr)
                    .splitlines() if re.search(
                        r"Unknown|Failed to parse|[Ii]nvalid|ignoring|"
                        r"not executable|[Mm]issing", line)]
                self.assertEqual(complaints, [], name)
                security = subprocess.run(
                    ["/usr/bin/systemd-analyze", "security", "--offline=yes",
                     f"--root={root}", "--no-pager", name],
                    capture_output=True, text=True, timeout=60)
                score = re.search(r"Overall exposure level for \S+: "
                                  r"([\d.]+)", security.stdout)
                self.assertIsNotNone(score, security.stdout[-500:] +
                                     security.stderr[-500:])
                self.assertLessEqual(float(score.group(1)), 2.5, name)


class SampleConfigsTest(unittest.TestCase):
    """deploy/configs/: the sample trainer configs (also in the image)."""

    def test_configs_parse_and_listen_on_loopback_without_tokens(self):
        # A tracker without tokens lets any caller read every row and add,
        # remove or clear consumers: a sample that listens beyond loopback
        # must set auth_token_file.
        configs = sorted(glob.glob(path("deploy/configs/*.textproto")))
        self.assertGreaterEqual(len(configs), 3)
        for config in configs:
            with open(config, "rb") as f:
                text = f.read()
            result = subprocess.run(
                ["/usr/bin/protoc", f"--proto_path={ROOT}",
                 "--encode=deltastream.v1.TrainerConfig",
                 "proto/trainer_config.proto"],
                input=text, capture_output=True, timeout=30)
            self.assertEqual(result.returncode, 0,
                             f"{config}: {result.stderr.decode()}")
            text = "\n".join(line.split("#")[0]
                             for line in text.decode().splitlines())
            for listen in re.findall(r'\blisten:\s*"([^"]*)"', text):
                host = listen.rsplit(":", 1)[0].strip("[]")
                loopback = host in ("localhost", "::1") or \
                    host.startswith("127.")
                if not loopback:
                    self.assertIsNotNone(
                        re.search(r'auth_token_file:\s*"[^"]+"', text),
                        f"{config}: listens on {listen} without tokens")


if __name__ == "__main__":
    unittest.main()
