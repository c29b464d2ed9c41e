"""Software versions on a node (driver, CUDA, NCCL, torch) and their consistency across nodes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .findings import Finding, Severity

FIELDS = ("driver", "cuda", "nccl", "torch")


@dataclass(frozen=True)
class NodeVersions:
    node: str
    driver: str = ""
    cuda: str = ""
    nccl: str = ""
    torch: str = ""


def local_versions(node: str, driver: str = "", cuda: str = "") -> NodeVersions:
    """The local torch/NCCL versions (NCCL only where torch has CUDA); driver/CUDA from NVML."""
    try:
        import torch  # deferred: heavy (torch)

        torch_v = str(torch.__version__)
        nccl = ""
        if torch.cuda.is_available():
            try:
                v = torch.cuda.nccl.version()
                nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
            except (RuntimeError, AttributeError):
                nccl = ""
    except ImportError:
        torch_v, nccl = "", ""
    return NodeVersions(node=node, driver=driver, cuda=cuda, nccl=nccl, torch=torch_v)


def check_version_consistency(reports: list[NodeVersions] | tuple[NodeVersions, ...]) -> list[Finding]:
    """Every node whose version differs from the majority gets a FAIL finding (empty values are skipped)."""
    findings: list[Finding] = []
    for name in FIELDS:
        values = Counter(getattr(r, name) for r in reports if getattr(r, name))
        if len(values) <= 1:
            continue
        majority, count = values.most_common(1)[0]
        for r in reports:
            v = getattr(r, name)
            if v and v != majority:
                findings.append(
                    Finding(
                        check="versions",
                        code=f"versions.{name}",
                        subject=r.node,
                        severity=Severity.FAIL,
                        message=f"{name} {v} differs from {majority} on {count} of {len(reports)} nodes",
                        evidence={"field": name, "value": v, "majority": majority, "versions": dict(values)},
                    )
                )
    return findings
