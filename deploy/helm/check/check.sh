#!/usr/bin/env bash
# The chart's check (`make test-helm`, which installs the tools and sets the variables below):
# `helm lint --strict` with each values file; every object rendered from them, and from renders
# that take the remaining branches, validated against the API schema of every Kubernetes release
# in KUBE_VERSIONS, and the router's command line parsed by the pinned vllm-router; then broken
# renders, which must be rejected.
set -euo pipefail
: "${HELM:?}" "${VALIDATOR_PYTHON:?}" "${NODE_MODULES:?}" "${KUBE_VERSIONS:?}" "${OUT:?}"

here=$(cd "$(dirname "$0")" && pwd)
chart=$here/../superinfer
newest=${KUBE_VERSIONS##* }
mkdir -p "$OUT"

render() {  # render NAME [helm template flags...]: the manifests into $OUT/NAME.yaml
  local name=$1
  shift
  "$HELM" template demo "$chart" --namespace llm --kube-version "$newest" "$@" > "$OUT/$name.yaml"
}

validate() {  # validate FILE...: against every release; the validator's report on stdout
  local version status=0
  for version in $KUBE_VERSIONS; do
    "$VALIDATOR_PYTHON" "$here/validate.py" --kube-version "$version" --node-modules "$NODE_MODULES" "$@" \
      || status=$?
  done
  return $status
}

expect_invalid() {  # expect_invalid NAME PATTERN [helm flags...]: the validator must reject it
  local name=$1 pattern=$2 report
  shift 2
  render "$name" "$@"
  if report=$(validate "$OUT/$name.yaml"); then
    echo "FAIL $name: the validator accepted a broken object"; echo "$report"; exit 1
  fi
  if ! grep -q -- "$pattern" <<<"$report"; then
    echo "FAIL $name: rejected, but not for '$pattern'"; echo "$report"; exit 1
  fi
  echo "rejected as expected ($name): $(grep INVALID <<<"$report" | head -1)"
}

"$HELM" lint --strict "$chart" --kube-version "$newest"
"$HELM" lint --strict "$chart" --kube-version "$newest" -f "$chart/values-multigpu.yaml"

render default
render multigpu -f "$chart/values-multigpu.yaml"
# The branches neither values file takes: KEDA, hostPath, an existing claim, a bounded
# emptyDir, no GPU.
render keda --set keda.enabled=true --set serviceMonitor.enabled=true \
  --set server.modelCache.type=hostPath --set server.gpu.enabled=false
render existing-claim --set server.modelCache.type=pvc --set server.modelCache.pvc.existingClaim=models
render sized-cache --set server.modelCache.emptyDir.sizeLimit=50Gi --set-json 'server.extraArgs=["--scheduler","fcfs"]'
rendered=("$OUT"/{default,multigpu,keda,existing-claim,sized-cache}.yaml)
validate "${rendered[@]}" | grep -v '^ok '
"$VALIDATOR_PYTHON" "$here/check_router_args.py" "${rendered[@]}"

# The validator must catch what Kubernetes would refuse: a wrong type, an unknown field (strict),
# a wrong type in a custom resource.
expect_invalid wrong-type "spec.replicas: 'two' is not of type" --set server.replicas=two
expect_invalid unknown-field "'runAsUsr' was unexpected" --set-json 'server.podSecurityContext={"runAsUsr":1000}'
expect_invalid crd-wrong-type "interval must be string" --set serviceMonitor.enabled=true --set serviceMonitor.interval=15
# The router's command line is checked by the router's own parser.
render bad-policy --set router.policy=least_loaded
if report=$("$VALIDATOR_PYTHON" "$here/check_router_args.py" "$OUT/bad-policy.yaml"); then
  echo "FAIL bad-policy: vllm-router's parser accepted a policy it does not have"; echo "$report"; exit 1
fi
echo "rejected as expected (bad-policy): $(grep INVALID <<<"$report")"
# And the chart refuses settings that cannot work together.
if "$HELM" template demo "$chart" --set autoscaling.enabled=true --set keda.enabled=true >/dev/null 2>&1; then
  echo "FAIL: the chart rendered two autoscalers for one Deployment"; exit 1
fi
echo "rejected as expected (two autoscalers)"
echo "helm chart: lint, render and validation against Kubernetes $KUBE_VERSIONS passed"
