"""Kubernetes tools: the Kubeflow CRDs' schemas (extracted, shipped as data) and a validator of manifests against them."""
