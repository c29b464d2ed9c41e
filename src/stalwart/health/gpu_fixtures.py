"""Read recorded GPU telemetry: an NVML snapshot (JSON), ``nvidia-smi -q -x`` (XML), a sampled CSV.

Every reader returns observations; anything it cannot parse becomes a *problem* string on the
observation (which a check turns into a ``telemetry.bad`` finding), never an exception.
"""

from __future__ import annotations

import csv
import io
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ..errors import TelemetryError
from ..inputs import MiB, parse_json, read_text_file
from .gpu_observation import CLOCK_NAMES, GpuNodeObservation, GpuObservation, GpuSample, NvLinkObservation

SNAPSHOT = "nvml_snapshot.json"
SMI_XML = "nvidia-smi-q.xml"
MAX_FIXTURE_BYTES = 64 * MiB
MAX_GPUS = 1024  # GPU entries per node read from one record
MAX_NVLINKS = 64


def _num(value: object) -> float | None:
    """A recorded value as a number; ``"EXC ..."``/``"ret 3"``/``N/A`` mean not available."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            out = float(value)
        except OverflowError:
            return None
        return out if math.isfinite(out) else None
    if isinstance(value, str):
        m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
        if m and not value.startswith(("EXC", "ret")):
            return float(m.group(1))
    return None


def _int(value: object) -> int | None:
    v = _num(value)
    return None if v is None or abs(v) > 2**63 else int(v)


# Any: a recorded snapshot is JSON of any shape (json.loads)
def _gpu_from_snapshot(index: int, d: dict[str, Any]) -> GpuObservation:
    fields = d.get("field_values") or {}
    remap_raw = d.get("remapped_rows")
    # Any: JSON of any shape (json.loads), each value checked where it is read
    remap: list[Any] | None = remap_raw if isinstance(remap_raw, list) and len(remap_raw) == 4 else None
    errors = []
    for key, value in d.items():
        if (
            isinstance(value, str)
            and value.startswith("EXC")
            and "NotSupported" not in value
            and "Timeout" not in value
        ):
            errors.append(f"{key}: {value[4:]}")
    links = []
    for link in range(min(max(_int(d.get("nvlink_count", 0)) or 0, 0), MAX_NVLINKS)):
        links.append(
            NvLinkObservation(
                link=link,
                active=None
                if _int(d.get(f"nvlink{link}_state")) is None
                else bool(_int(d.get(f"nvlink{link}_state"))),
                replay=_int(fields.get(f"NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L{link}")),
                recovery=_int(fields.get(f"NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L{link}")),
                crc_flit=_int(fields.get(f"NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{link}")),
                crc_data=_int(fields.get(f"NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{link}")),
            )
        )
    ecc_mode = d.get("ecc_mode")
    pci = d.get("pci") or {}
    fields = fields if isinstance(fields, dict) else {}
    power = _num(d.get("power_mw"))
    limit = _num(d.get("power_limit_mw"))
    util_raw = d.get("util")
    # Any: JSON of any shape (json.loads), each value checked where it is read
    util: dict[str, Any] = util_raw if isinstance(util_raw, dict) else {}
    xids_raw = d.get("xid_events")
    xids: list[Any] = xids_raw if isinstance(xids_raw, list) else []  # Any: JSON of any shape (json.loads)
    return GpuObservation(
        index=index,
        name=str(d.get("name", "")),
        uuid=str(d.get("uuid", "")),
        bus_id=str(pci.get("busId", "")) if isinstance(pci, dict) else "",
        temp_gpu=_num(d.get("temp_gpu")),
        temp_mem=_num(fields.get("NVML_FI_DEV_MEMORY_TEMP")),
        temp_shutdown=_num(d.get("temp_thr_shutdown")),
        temp_slowdown=_num(d.get("temp_thr_slowdown")),
        temp_gpu_max=_num(d.get("temp_thr_gpu_max")),
        temp_mem_max=_num(d.get("temp_thr_mem_max")),
        clock_event_reasons=_int(d.get("clock_event_reasons")),
        utilization=_num(util.get("gpu")),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        ecc_enabled=bool(ecc_mode[0]) if isinstance(ecc_mode, list) and ecc_mode else None,
        ecc_vol_corr=_int(d.get("ecc_vol_corr")),
        ecc_vol_uncorr=_int(d.get("ecc_vol_uncorr")),
        ecc_agg_corr=_int(d.get("ecc_agg_corr")),
        ecc_agg_uncorr=_int(d.get("ecc_agg_uncorr")),
        remap_corr=_int(remap[0]) if remap is not None else None,
        remap_unc=_int(remap[1]) if remap is not None else None,
        remap_pending=bool(remap[2]) if remap is not None else None,
        remap_failure=bool(remap[3]) if remap is not None else None,
        pcie_gen=_int(d.get("pcie_gen")),
        pcie_max_gen=_int(d.get("pcie_max_gen")),
        pcie_width=_int(d.get("pcie_width")),
        pcie_max_width=_int(d.get("pcie_max_width")),
        pcie_replay=_int(d.get("pcie_replay")),
        nvlinks=tuple(links),
        xid_events=tuple(int(x) for x in xids if isinstance(x, int)),
        recovery_action=_int(fields.get("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")),
        lost=bool(d.get("lost", False)) or any("GpuIsLost" in e for e in errors),
        errors=tuple(errors),
    )


def load_nvml_snapshot(path: Path) -> GpuNodeObservation:
    """The JSON written by our NVML recorder: ``{"nvml": {...one GPU...}}`` or ``{"nvml": {"gpus": [...]}}``."""
    source = f"fixture:{path.name}"
    try:
        text = read_text_file(
            path, MAX_FIXTURE_BYTES, "NVML snapshot", error=TelemetryError, replace_errors=True
        )
        data = parse_json(text, f"NVML snapshot {path.name}", error=TelemetryError)
        if not isinstance(data, dict):
            raise TypeError("the snapshot is not an object")
        nvml = data["nvml"]
        if not isinstance(nvml, dict):
            raise TypeError("'nvml' is not an object")
    except (TelemetryError, KeyError, TypeError) as exc:
        return GpuNodeObservation(
            source=source,
            available=False,
            unavailable_reason="NVML snapshot unreadable",
            problems=(f"{path.name}: {type(exc).__name__}: {exc}",),
        )
    if nvml.get("unavailable"):
        return GpuNodeObservation(source=source, available=False, unavailable_reason=str(nvml["unavailable"]))
    gpus_raw = nvml.get("gpus")
    # Any: JSON of any shape (json.loads), each value checked where it is read
    per_gpu: list[Any] = gpus_raw if isinstance(gpus_raw, list) else [nvml]
    gpus, problems = [], []
    if len(per_gpu) > MAX_GPUS:
        problems.append(f"{path.name}: {len(per_gpu)} GPU entries; only the first {MAX_GPUS} are read")
    for i, d in enumerate(per_gpu[:MAX_GPUS]):
        if not isinstance(d, dict):
            problems.append(f"{path.name}: gpu entry {i} is not an object")
            continue
        try:
            gpus.append(_gpu_from_snapshot(i, d))
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            problems.append(
                f"{path.name}: gpu entry {i} has a value of the wrong type ({type(exc).__name__})"
            )
    cuda = nvml.get("cuda_driver")
    cuda_s = (
        f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        if isinstance(cuda, int) and not isinstance(cuda, bool)
        else str(cuda or "")[:100]
    )
    count = _int(nvml.get("count"))
    if count is not None and count != len(gpus):
        problems.append(f"{path.name}: count says {count} GPUs but {len(gpus)} are recorded")
    return GpuNodeObservation(
        source=source,
        available=True,
        driver=str(nvml.get("driver", ""))[:100],
        cuda=cuda_s,
        gpus=tuple(gpus),
        problems=tuple(problems),
    )


def _xml_text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    el = node.find(path)
    return None if el is None or el.text is None else el.text.strip()


def _yes(text: str | None) -> bool | None:
    if text is None or text == "N/A":
        return None
    return text.lower() in ("yes", "enabled", "active")


def load_smi_xml(path: Path) -> GpuNodeObservation:
    """``nvidia-smi -q -x`` output. A truncated or malformed file is a problem, not a crash."""
    source = f"fixture:{path.name}"
    try:
        root = ET.fromstring(
            read_text_file(
                path, MAX_FIXTURE_BYTES, "nvidia-smi XML", error=TelemetryError, replace_errors=True
            )
        )
    except (TelemetryError, ET.ParseError) as exc:
        return GpuNodeObservation(
            source=source,
            available=False,
            unavailable_reason="nvidia-smi XML unreadable",
            problems=(f"{path.name}: {type(exc).__name__}: {exc}",),
        )
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        reasons = 0
        cer = g.find("clocks_event_reasons")
        if cer is not None:
            for bit, name in CLOCK_NAMES.items():
                if _yes(_xml_text(cer, f"clocks_event_reason_{name}")):
                    reasons |= bit
        width = _xml_text(g, "pci/pci_gpu_link_info/link_widths/current_link_width")
        max_width = _xml_text(g, "pci/pci_gpu_link_info/link_widths/max_link_width")
        gpus.append(
            GpuObservation(
                index=i,
                name=_xml_text(g, "product_name") or "",
                uuid=_xml_text(g, "uuid") or "",
                bus_id=g.get("id", ""),
                temp_gpu=_num(_xml_text(g, "temperature/gpu_temp")),
                temp_mem=_num(_xml_text(g, "temperature/memory_temp")),
                clock_event_reasons=reasons if cer is not None else None,
                ecc_enabled=_yes(_xml_text(g, "ecc_mode/current_ecc")),
                ecc_vol_corr=_int(_xml_text(g, "ecc_errors/volatile/dram_correctable")),
                ecc_vol_uncorr=_int(_xml_text(g, "ecc_errors/volatile/dram_uncorrectable")),
                ecc_agg_corr=_int(_xml_text(g, "ecc_errors/aggregate/dram_correctable")),
                ecc_agg_uncorr=_int(_xml_text(g, "ecc_errors/aggregate/dram_uncorrectable")),
                remap_corr=_int(_xml_text(g, "remapped_rows/remapped_row_corr")),
                remap_unc=_int(_xml_text(g, "remapped_rows/remapped_row_unc")),
                remap_pending=_yes(_xml_text(g, "remapped_rows/remapped_row_pending")),
                remap_failure=_yes(_xml_text(g, "remapped_rows/remapped_row_failure")),
                pcie_gen=_int(_xml_text(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                pcie_max_gen=_int(_xml_text(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                pcie_width=_int(width),
                pcie_max_width=_int(max_width),
                pcie_replay=_int(_xml_text(g, "pci/replay_counter")),
            )
        )
    problems = []
    attached = _int(_xml_text(root, "attached_gpus"))
    if attached is not None and attached != len(gpus):
        problems.append(f"{path.name}: attached_gpus={attached} but {len(gpus)} <gpu> entries")
    return GpuNodeObservation(
        source=source,
        available=True,
        driver=_xml_text(root, "driver_version") or "",
        cuda=_xml_text(root, "cuda_version") or "",
        gpus=tuple(gpus),
        problems=tuple(problems),
    )


_CSV_FIELDS = ("temp_gpu", "temp_mem", "power_w", "sm_mhz", "util")


def load_series_csv(path: Path) -> tuple[tuple[GpuSample, ...], tuple[str, ...]]:
    """A sampled telemetry CSV (``t,phase,temp_gpu,...,clock_event_reasons,ecc_corr_vol,pcie_replay``)."""
    samples: list[GpuSample] = []
    problems: list[str] = []
    try:
        text = read_text_file(
            path, MAX_FIXTURE_BYTES, "telemetry CSV", error=TelemetryError, replace_errors=True
        )
        for lineno, row in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
            try:
                samples.append(
                    GpuSample(
                        t=float(row["t"]),
                        gpu=int(row.get("gpu") or 0),
                        phase=row.get("phase") or "",
                        **{k: float(row[k]) for k in _CSV_FIELDS if row.get(k) not in (None, "")},
                        clock_event_reasons=int(row["clock_event_reasons"]),
                        ecc_corr_vol=int(row["ecc_corr_vol"]) if row.get("ecc_corr_vol") else None,
                        pcie_replay=int(row["pcie_replay"]) if row.get("pcie_replay") else None,
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"{path.name}:{lineno}: unparseable row ({type(exc).__name__}: {exc})")
    except (TelemetryError, csv.Error) as exc:
        problems.append(f"{path.name}: {exc}")
    if len(problems) > 5:
        problems = [*problems[:5], f"{path.name}: ... and {len(problems) - 5} more bad rows"]
    return tuple(samples), tuple(problems)


def load_gpu_fixture(directory: Path) -> GpuNodeObservation:
    """A directory of recorded telemetry: snapshot JSON (or XML) plus any ``*telemetry*.csv``."""
    if (directory / SNAPSHOT).exists():
        obs = load_nvml_snapshot(directory / SNAPSHOT)
    elif (directory / SMI_XML).exists():
        obs = load_smi_xml(directory / SMI_XML)
    else:
        obs = GpuNodeObservation(
            source=f"fixture:{directory.name}",
            available=False,
            unavailable_reason=f"no {SNAPSHOT} or {SMI_XML} in {directory}",
        )
    series: list[GpuSample] = []
    problems = list(obs.problems)
    for csv_path in sorted(directory.glob("*telemetry*.csv")):
        s, p = load_series_csv(csv_path)
        series.extend(s)
        problems.extend(p)
    return GpuNodeObservation(
        source=obs.source,
        available=obs.available,
        unavailable_reason=obs.unavailable_reason,
        driver=obs.driver,
        cuda=obs.cuda,
        gpus=obs.gpus,
        series=tuple(series),
        problems=tuple(problems),
        timed_out=obs.timed_out,
    )
