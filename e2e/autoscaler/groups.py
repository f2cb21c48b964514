"""The test cloud's node groups: sizes, instances and the answers to the autoscaler.

Where it sits: pure bookkeeping under ``cloud``, which calls these methods from
its HTTP hook (one per externalgrpc CloudProvider call, JSON in the proto's
field names) and acts on what they return (the nodes to start or stop). An
instance is named ``tf-<group>-<n>`` with provider ID ``torchflex-test://<name>``;
the autoscaler matches a Node to its instance by ``spec.providerID``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

PROVIDER = "torchflex-test"
GROUP_LABEL = "torchflex.io/e2e-node-group"
# Node numbers 1..40 of the cloud: host address 127.10.<slot>.<100+n>, pods from
# address index 20000 + 1000 n (the cluster's own kubelet allocates from 2 up).
MAX_NODES = 40
FIRST_HOST = 100
POD_IP_BLOCK = 1000
FIRST_POD_IP = 20000


class CloudError(Exception):
    """A call the cloud refuses (unknown group, size out of bounds): a gRPC error."""


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    name: str
    min_size: int
    max_size: int
    spot: bool = False


@dataclasses.dataclass
class Instance:
    name: str
    group: str
    number: int

    @property
    def provider_id(self) -> str:
        return f"{PROVIDER}://{self.name}"

    @property
    def host(self) -> int:
        return FIRST_HOST + self.number

    @property
    def first_pod_ip(self) -> int:
        return FIRST_POD_IP + POD_IP_BLOCK * self.number


@dataclasses.dataclass
class Groups:
    specs: dict[str, GroupSpec]
    instances: dict[str, Instance] = dataclasses.field(default_factory=dict)
    used_numbers: set[int] = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, *specs: GroupSpec) -> Groups:
        return cls({s.name: s for s in specs})

    def spec(self, group: str) -> GroupSpec:
        if group not in self.specs:
            raise CloudError(f"no node group {group!r}")
        return self.specs[group]

    def members(self, group: str) -> list[Instance]:
        return [i for i in self.instances.values() if i.group == group]

    def target(self, group: str) -> int:
        """Instances are created at once: the target size is the instance count."""
        return len(self.members(group))

    def node_group(self, group: str) -> dict[str, Any]:
        spec = self.spec(group)
        return {"id": spec.name, "minSize": spec.min_size, "maxSize": spec.max_size}

    def group_of(self, node: Mapping[str, Any]) -> str | None:
        """The group of a Node as the autoscaler sends it (providerID, name); None: not ours."""
        pid = str(node.get("providerID") or "")
        for inst in self.instances.values():
            if inst.provider_id == pid:
                return inst.group
        return None

    def increase(self, group: str, delta: int) -> list[Instance]:
        """New instances of ``group`` (to start); refused beyond its maximum."""
        spec = self.spec(group)
        if delta <= 0 or self.target(group) + delta > spec.max_size:
            raise CloudError(f"{group}: size {self.target(group)} + {delta} > {spec.max_size}")
        out = []
        for _ in range(delta):
            number = min(n for n in range(1, MAX_NODES + 1) if n not in self.used_numbers)
            self.used_numbers.add(number)
            inst = Instance(f"tf-{group}-{number}", group, number)
            self.instances[inst.name] = inst
            out.append(inst)
        return out

    def remove(self, name: str) -> Instance:
        """Forget an instance (deleted by the autoscaler, or reclaimed by the cloud)."""
        inst = self.instances.pop(name)
        self.used_numbers.discard(inst.number)
        return inst

    def by_provider_ids(self, group: str, nodes: list[Mapping[str, Any]]) -> list[Instance]:
        """The instances of ``group`` the autoscaler names (NodeGroupDeleteNodes)."""
        wanted = {str(n.get("providerID") or "") for n in nodes}
        found = [i for i in self.members(group) if i.provider_id in wanted]
        if len(found) != len(wanted):
            raise CloudError(f"{group}: not all of {sorted(wanted)} belong to it")
        return found

    def not_registered(self, group: str, delta: int, registered: set[str]) -> list[Instance]:
        """NodeGroupDecreaseTargetSize (``delta`` < 0): instances whose Node never
        registered, newest first; refused if that would touch a registered one."""
        waiting = sorted(
            (i for i in self.members(group) if i.name not in registered),
            key=lambda i: -i.number,
        )
        if delta >= 0 or -delta > len(waiting):
            raise CloudError(f"{group}: cannot decrease by {delta}, {len(waiting)} unregistered")
        return waiting[:-delta]

    def instances_answer(self, group: str) -> dict[str, Any]:
        running = 1  # InstanceStatus.instanceRunning: a started process is running
        return {
            "instances": [
                {"id": i.provider_id, "status": {"instanceState": running}}
                for i in sorted(self.members(group), key=lambda i: i.number)
            ]
        }
