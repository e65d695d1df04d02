"""Offline checks of deploy/: the Kubernetes manifests against a small
structural schema (k8s_schema.yaml) and against each other (Services and
their pods, volumes and claims, probes and ports, grace period and drain,
torchrun environment); the Dockerfile (stages, packages, binaries that exist
as Bazel targets); the systemd units. Docker and a cluster cannot run here.
"""

import configparser
import glob
import os
import re
import shlex
import subprocess
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


def pod_specs(objects):
    """(object name, pod template) of every Job and Deployment."""
    return [(o["metadata"]["name"], o["spec"]["template"]) for _, o in objects
            if o["kind"] in ("Job", "Deployment")]


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
        self.assertGreaterEqual(len(self.objects), 9)
        for file, obj in self.objects:
            checker.check_object(f"{file}:{obj.get('kind')}/"
                                 f"{obj.get('metadata', {}).get('name')}", obj)
        self.assertEqual(checker.errors, [])

    def test_the_schema_catches_mistakes(self):
        with open(path("tests/deploy/k8s_schema.yaml")) as f:
            checker = SchemaChecker(yaml.safe_load(f))
        job = yaml.safe_load(yaml.safe_dump(self.by_kind["Job"][
            "deltastream-trainer"]))
        job["spec"]["template"]["spec"]["containers"][0]["imagePullPolic"] = 1
        job["spec"]["completions"] = "2"
        checker.check_object("job", job)
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
                self.assertEqual(container["image"], "deltastream:dev")
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
                                  ("deltastream-auth", "deltastream-tls"))
            has_grpc_probe = any("grpc" in c.get(p, {})
                                 for c in pod["containers"]
                                 for p in ("readinessProbe",))
            if name in ("deltastream-trainer", "deltastream-predictor"):
                self.assertTrue(has_grpc_probe, name)
        self.assertEqual(used_claims, claims)  # no claim left unused

    def test_predictor_lookups_take_the_trackers_tokens(self):
        # The predictor's lookup API is guarded by the token file the
        # tracker (the trainer's config) uses, from the same Secret.
        config = self.by_kind["ConfigMap"]["deltastream-trainer"]["data"][
            "trainer.textproto"]
        tokens = re.search(r'auth_token_file:\s*"([^"]+)"', config).group(1)
        pod = self.by_kind["Deployment"]["deltastream-predictor"]["spec"][
            "template"]["spec"]
        self.assertIn(f"--auth_token_file={tokens}",
                      pod["containers"][0]["args"])

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


class SystemdTest(unittest.TestCase):

    def test_units_parse_and_run_binaries_of_the_image(self):
        binaries = dockerfile_binaries()
        units = sorted(glob.glob(path("deploy/systemd/*.service")))
        self.assertEqual(len(units), 4)
        for unit in units:
            parser = configparser.ConfigParser(interpolation=None,
                                               strict=True)
            parser.optionxform = str
            parser.read(unit)
            self.assertEqual(set(parser.sections()),
                             {"Unit", "Service", "Install"}, unit)
            command = shlex.split(parser["Service"]["ExecStart"])
            self.assertTrue(command[0].startswith("/usr/local/bin/"), unit)
            self.assertIn(os.path.basename(command[0]), binaries, unit)
            args = [a.replace("%i", "2") for a in command[1:]]
            self.assertEqual(unknown_flags(
                BINARY_PATHS[os.path.basename(command[0])], args), set(), unit)
            self.assertIn("TimeoutStopSec", parser["Service"], unit)
            self.assertEqual(parser["Service"]["User"], "deltastream", unit)
        with open(path("deploy/systemd/deltastream-trainer.service")) as f:
            timeout = int(re.search(r"TimeoutStopSec=(\d+)", f.read())
                          .group(1))
        config = load_manifests()
        drain = max(int(m) for _, o in config if o["kind"] == "ConfigMap"
                    for m in re.findall(r"drain_seconds:\s*(\d+)",
                                        o["data"]["trainer.textproto"]))
        self.assertGreater(timeout, drain)


if __name__ == "__main__":
    unittest.main()
