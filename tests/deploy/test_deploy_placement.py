"""The chart with placement enabled: every object validates against Kubernetes' schemas,
the placement command parses as the dsec CLI would take it, kube-scheduler's
configuration names dsec's filter and prioritize verbs at the placement Service, and the
RBAC grants the node labeller only what it patches."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from test_deploy import K8S_VERSIONS, _parse_dsec_command, _render, helm  # noqa: F401

pytestmark = pytest.mark.timeout(1800)
PLACEMENT = ("--set", "placement.enabled=true", "--set", "placement.scheduler.deploy=true")


def test_chart_with_placement_renders_validates_and_wires_the_extender(helm: str) -> None:  # noqa: F811
    objects = _render(helm, None, *PLACEMENT)
    for obj in objects:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): "
                            f"{exc.message} at {'.'.join(map(str, exc.path))}")
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    deployment = by_name[("Deployment", "dsec-placement")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dsec-placement"
    assert pod["automountServiceAccountToken"] is True
    container = pod["containers"][0]
    args = [re.sub(r"\$\((\w+)\)", "kafka:9092", arg) for arg in container["args"]]
    _parse_dsec_command(args)
    assert args[:2] == ["placement", "serve"] and "--label-nodes" in args
    assert {"name": "http", "containerPort": 8470, "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = by_name[("Service", "dsec-placement")]
    assert service["spec"]["ports"][0]["targetPort"] == "http"

    config = yaml.safe_load(by_name[("ConfigMap", "dsec-scheduler-config")]["data"][
        "scheduler-config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://dsec-placement.training.svc:8470/scheduler"
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert config["profiles"] == [{"schedulerName": "dsec-scheduler"}]

    role = by_name[("ClusterRole", "dsec-placement-nodes")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                              "verbs": ["get", "list", "watch", "patch"]}]
    binding = by_name[("ClusterRoleBinding", "dsec-placement-nodes")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dsec-placement",
                                    "namespace": "training"}]
    scheduler = by_name[("Deployment", "dsec-scheduler")]["spec"]["template"]["spec"]
    assert scheduler["serviceAccountName"] == "dsec-scheduler"
    assert {o["roleRef"]["name"] for o in objects if o["kind"] in (
        "ClusterRoleBinding", "RoleBinding") and o["metadata"]["name"].startswith(
        "dsec-scheduler")} == {"system:kube-scheduler", "system:volume-scheduler",
                               "extension-apiserver-authentication-reader"}


def test_chart_without_the_labeller_keeps_the_shared_account_and_no_rbac(helm: str) -> None:  # noqa: F811
    objects = _render(helm, None, "--set", "placement.enabled=true",
                      "--set", "placement.labelNodes.enabled=false")
    pod = next(o for o in objects if o["kind"] == "Deployment"
               and o["metadata"]["name"] == "dsec-placement")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dsec" and pod["automountServiceAccountToken"] is False
    assert not [o for o in objects if o["kind"].startswith("ClusterRole")]
    assert "--label-nodes" not in pod["containers"][0]["args"]
