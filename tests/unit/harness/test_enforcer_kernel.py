"""When the NetworkPolicy enforcer can run: the kernel's nftables ``queue`` expression.

``e2e.cluster.enforcer.kernel_lacks_nft_queue`` decides whether the enforced
tenancy test runs or reports itself skipped with the reason; read here from
kernel configs written as ``/proc/config.gz`` is.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from e2e.cluster.enforcer import kernel_lacks_nft_queue


def _config(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "config.gz"
    path.write_bytes(gzip.compress("\n".join(["CONFIG_NF_TABLES=y", *lines]).encode()))
    return path


@pytest.mark.parametrize(
    "lines",
    [("CONFIG_NFT_QUEUE=y",), ("CONFIG_MODULES=y", "CONFIG_NFT_QUEUE=m")],
)
def test_queue_built_in_or_loadable_is_enough(tmp_path: Path, lines: tuple[str, ...]) -> None:
    assert kernel_lacks_nft_queue(_config(tmp_path, *lines)) is None


def test_missing_queue_expression_is_named_with_the_module_situation(tmp_path: Path) -> None:
    # The development VMs: xtables NFQUEUE is there, nftables' queue is not, no modules.
    reason = kernel_lacks_nft_queue(
        _config(tmp_path, "# CONFIG_NFT_QUEUE is not set", "CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y")
    )
    assert reason is not None
    assert "CONFIG_NFT_QUEUE is not set" in reason and "loads no modules" in reason
    module_only = kernel_lacks_nft_queue(_config(tmp_path, "CONFIG_NFT_QUEUE=m"))
    assert module_only is not None and "loads no modules" in module_only


def test_unreadable_config_is_not_a_verdict(tmp_path: Path) -> None:
    # No /proc/config.gz: try the enforcer, which fails loudly if the kernel refuses.
    assert kernel_lacks_nft_queue(tmp_path / "absent.gz") is None
