"""The agreement between the operator and the in-pod agent.

Where it sits: a leaf package imported by both ``torchflex_operator`` and
``torchflex_agent``; it imports neither (import-linter enforces it), nor
torch, kopf or the Kubernetes client. Everything both sides must spell the
same way lives here: env var names, labels and annotations, exit codes, the
rendezvous backend names, the store key layout and the progress report format.
"""
