"""Pod attribution through the kubelet's pod-resources gRPC API (optional: needs gpumond[k8s])."""
