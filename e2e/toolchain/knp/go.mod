module torchflex.io/e2e/toolchain/knp

go 1.26.0

require sigs.k8s.io/kube-network-policies v1.1.0
