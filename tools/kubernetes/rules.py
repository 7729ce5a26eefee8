"""The checks the Kubeflow operators make on create that their CRD schemas leave out.

The MPI Operator validates an MPIJob in Go after defaulting it
(``pkg/apis/kubeflow/validation/validation.go``, v0.8): the launcher has 1 replica, the
workers at least 1, each restart policy is ``Never`` or ``OnFailure`` (``OnFailure`` when
left out), each template has a container, and ``<name>-worker-<N-1>`` is a DNS-1035 label
(it becomes a pod's host name). Trainer's TrainJob and TrainingRuntime CRDs carry CEL rules
that a plain schema validator does not run; the ones that apply on create are here: a
TrainJob's name is an RFC 1035 label of at most 63 characters, and a runtime's ``mlPolicy``
holds at most one of ``torch``, ``mpi``, ``jax``, ``xgboost``, ``flux``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")


def operator_rules(document: Mapping[str, Any]) -> list[str]:
    """The operator's own create-time checks for ``document``'s kind (empty: it passes them)."""
    kind = document.get("kind")
    if kind == "MPIJob":
        return _mpijob(document)
    if kind == "TrainJob":
        return _trainjob(document)
    if kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        return _runtime(document)
    return []


def _mpijob(job: Mapping[str, Any]) -> list[str]:
    errors = []
    specs = job.get("spec", {}).get("mpiReplicaSpecs", {})
    launcher, worker = specs.get("Launcher"), specs.get("Worker")
    if launcher is None:
        errors.append(".spec.mpiReplicaSpecs.Launcher: must have the Launcher replica spec")
    elif launcher.get("replicas", 1) != 1:
        errors.append(f".spec.mpiReplicaSpecs.Launcher.replicas: {launcher['replicas']} must be 1")
    replicas = 1
    if worker is not None:
        replicas = worker.get("replicas", 0)
        if replicas < 1:
            errors.append(f".spec.mpiReplicaSpecs.Worker.replicas: {replicas} must be >= 1")
    for role, spec in (("Launcher", launcher), ("Worker", worker)):
        if spec is None:
            continue
        policy = spec.get("restartPolicy", "OnFailure")
        if policy not in ("Never", "OnFailure"):
            errors.append(f".spec.mpiReplicaSpecs.{role}.restartPolicy: {policy!r} is not Never or OnFailure")
        if not spec.get("template", {}).get("spec", {}).get("containers"):
            errors.append(f".spec.mpiReplicaSpecs.{role}.template.spec.containers: must define a container")
    host = f"{job.get('metadata', {}).get('name', '')}-worker-{max(replicas, 1) - 1}"
    if len(host) > 63 or not _DNS_1035.match(host):
        errors.append(f".metadata.name: the last worker's host name {host!r} is not a DNS-1035 label "
                      "(lower case, digits, '-', at most 63 characters)")
    return errors


def _trainjob(job: Mapping[str, Any]) -> list[str]:
    name = str(job.get("metadata", {}).get("name", ""))
    if len(name) > 63 or not _DNS_1035.match(name):
        return [f".metadata.name: {name!r} must be an RFC 1035 label of at most 63 characters"]
    return []


def _runtime(runtime: Mapping[str, Any]) -> list[str]:
    policy = runtime.get("spec", {}).get("mlPolicy", {})
    chosen = [name for name in _POLICIES if name in policy]
    if len(chosen) > 1:
        return [f".spec.mlPolicy: only one of {', '.join(_POLICIES)} may be set, not {', '.join(chosen)}"]
    return []
