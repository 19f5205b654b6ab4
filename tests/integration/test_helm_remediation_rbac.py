"""The chart grants fleet remediation exactly what the Kubernetes backend calls, and nothing without it."""

from __future__ import annotations

import pytest

from tests.integration.helm_helpers import kinds, one, rendered

pytestmark = pytest.mark.integration


def test_remediation_gets_least_privilege_rbac_and_a_token() -> None:
    objects = rendered("ci/remediation-values.yaml")
    role = one(objects, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    binding = one(objects, "ClusterRoleBinding")
    account = one(objects, "ServiceAccount")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True


def test_no_rbac_and_no_token_without_kubernetes_remediation() -> None:
    objects = rendered(None)
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & set(kinds(objects))
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
