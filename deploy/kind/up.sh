#!/usr/bin/env bash
# dradriver on kind with fake GPUs: builds the image, creates the cluster (or reuses it),
# loads the image, installs the chart (4 fake H100s per node, dynamic MIG) and applies
# examples/claims/gpu-by-product.yaml. Needs docker, kind and kubectl.
# Not run by CI (no Docker there): `make demo` and `make test` are the tested paths.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
name=${KIND_CLUSTER_NAME:-dradriver}
image=dradriver:dev
ctx=kind-$name

helm=$(bash "$repo/tools/helm/build.sh" | tail -n1)/helm
docker build -f "$repo/deploy/Dockerfile" -t "$image" "$repo"
if ! kind get clusters | grep -qx "$name"; then
  kind create cluster --name "$name" --config "$repo/deploy/kind/cluster.yaml"
fi
kind load docker-image "$image" --name "$name"
"$helm" upgrade --install dradriver "$repo/deploy/helm/dradriver" --kube-context "$ctx" \
  --namespace dradriver --create-namespace --wait --timeout 5m \
  --set image.repository=dradriver --set image.tag=dev \
  --set devices=fake:4xH100-80GB --set migMode=dynamic \
  --set featureGates.DRAPartitionableDevices=true --set featureGates.DRAExtendedResource=true
kubectl --context "$ctx" get resourceslices
kubectl --context "$ctx" apply -f "$repo/examples/claims/gpu-by-product.yaml"

# The example's container runs nvidia-smi, which fake GPUs cannot answer; what the
# plugin prepared shows in the claim's status.devices.
for _ in $(seq 60); do
  claim=$(kubectl --context "$ctx" get pod gpu-by-product \
    -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  if [ -n "$claim" ] && [ -n "$(kubectl --context "$ctx" get resourceclaim "$claim" \
      -o jsonpath='{.status.devices[0].device}')" ]; then
    kubectl --context "$ctx" get resourceclaim "$claim" \
      -o jsonpath='{range .status.devices[*]}{.pool}/{.device}: {.data.uuid}{"\n"}{end}'
    exit 0
  fi
  sleep 2
done
echo "the claim was not prepared in 2 minutes:" >&2
kubectl --context "$ctx" describe pod gpu-by-product >&2
exit 1
