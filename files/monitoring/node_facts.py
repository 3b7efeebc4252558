#!/usr/bin/env python3
"""The toolkit's node state as Prometheus metrics, for node-exporter's textfile collector (stdlib only; uploaded
to each node and run as root by a systemd timer):

    node_facts.py --config /etc/inference-nodes/monitoring/node-facts.json   # writes the config's "out" file
    node_facts.py --config ... --print                                       # the same text on stdout

It reports what the deploys and their timers leave behind: the NVIDIA driver (userspace and loaded kernel module,
and whether they match), per-GPU readings from nvidia-smi, Xid errors in this boot's kernel log, the model
filesystem's free space, the last deep verify of the model snapshot, the last serving gate (head only) and the
inference service's systemd state.

Why the file is replaced atomically: node-exporter reads the textfile directory on every scrape, and a scrape that
lands while the file is half written would see some series vanish (or a truncated line, which makes node-exporter
drop the whole file). So the text goes to a hidden temporary file in the same directory (the collector reads only
``*.prom``; the same filesystem makes the rename atomic), is fsynced, and then os.replace()s the old file.

Why a reading that is not there is absent, not 0: a 0 is a claim. GB10 reports its memory as ``[N/A]``; exporting
``memory_total_bytes 0`` there would say the GPU has no memory, and a deep verify that never ran exported as
``deep_verify_ok 0`` would page as a corrupt model. An absent series says "unknown", which alerts match with
``absent()`` when they mean to. Each source is read in its own try, so one that fails leaves the others (and the
file) intact; a reason goes to stderr, which the timer's journal keeps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

PREFIX = "inference_nodes_"
GPU_QUERY = "index,driver_version,utilization.gpu,power.draw,temperature.gpu,ecc.errors.uncorrected.volatile.total," \
            "memory.used,memory.total"
MIB = 1048576
XID_MARK = "NVRM: Xid"
XID_CODE = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
XID_TIMEOUT_S = 10
# NVIDIA's hardware Xids, a GPU to drain, reset or replace (double-bit ECC, page retirement and row remapping,
# NVLink, fallen off the bus, ECC rates and contained/uncontained errors, GSP): they page. The others warn (13,
# 31, 43, 45: an application's fault, or a GPU process that was killed).
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 93, 94, 95, 119, 120})
SYSTEMCTL_TIMEOUT_S = 10
MISMATCH_MARK = "Driver/library version mismatch"
NVML_VERSION = re.compile(r"^\s*NVML library version:\s*(\S+)\s*$", re.MULTILINE)
NUMBER = re.compile(r"^-?[0-9]+(?:\.[0-9]+)?$")  # not float(): that also takes "nan", "inf" and "1_0"

# The per-GPU columns that become series: (column, metric, unit conversion). index and driver_version are not
# readings. Percent is divided (not multiplied by 0.01) so that 29 % is 0.29, not 0.29000000000000004.
GPU_SERIES = (
    ("utilization.gpu", "gpu_utilization_ratio", lambda percent: percent / 100),
    ("power.draw", "gpu_power_watts", lambda watts: watts),
    ("temperature.gpu", "gpu_temperature_celsius", lambda celsius: celsius),
    ("ecc.errors.uncorrected.volatile.total", "gpu_ecc_uncorrected_errors", lambda errors: errors),
    ("memory.used", "gpu_memory_used_bytes", lambda mib: mib * MIB),
    ("memory.total", "gpu_memory_total_bytes", lambda mib: mib * MIB),
)

# name (without PREFIX) -> (type, help). The order here is the order in the file.
FAMILIES = {
    "facts_timestamp_seconds": ("gauge", "Unix time at which node_facts.py wrote these metrics."),
    "facts_interval_seconds": ("gauge", "How often the timer runs node_facts.py (the stale-metrics alert reads it)."),
    "driver_info": ("gauge", "NVIDIA driver: the branch the inventory pins, the userspace (nvidia-smi/NVML) "
                             "version and the loaded kernel module version; empty where unknown."),
    "driver_module_matches": ("gauge", "1 if the loaded kernel module's version equals the userspace driver "
                                       "version, else 0 (mismatch, no module loaded, or nvidia-smi failed)."),
    "gpu_query_ok": ("gauge", "1 if nvidia-smi answered the GPU query, else 0."),
    "gpu_utilization_ratio": ("gauge", "GPU utilization, 0 to 1 (nvidia-smi utilization.gpu / 100)."),
    "gpu_power_watts": ("gauge", "GPU power draw in watts."),
    "gpu_temperature_celsius": ("gauge", "GPU core temperature in degrees Celsius."),
    "gpu_ecc_uncorrected_errors": ("gauge", "Uncorrected ECC errors since the driver loaded (volatile total)."),
    "gpu_memory_used_bytes": ("gauge", "GPU memory in use, bytes."),
    "gpu_memory_total_bytes": ("gauge", "GPU memory in all, bytes."),
    "gpu_xid_errors": ("gauge", "Kernel log lines with 'NVRM: Xid' since boot, by kind: hardware (NVIDIA's hardware "
                                "codes) or other; absent when the journal could not be read."),
    "model_free_bytes": ("gauge", "Bytes free to unprivileged users on the model directory's filesystem."),
    "deep_verify_ok": ("gauge", "1 if the last deep verify of the model snapshot found every file good, 0 if not."),
    "deep_verify_timestamp_seconds": ("gauge", "Unix time of the last deep verify."),
    "deep_verify_max_age_seconds": ("gauge", "How old the last deep verify may be before it is overdue."),
    "serving_gate_ok": ("gauge", "1 if the last serving gate run passed, 0 if it failed."),
    "serving_gate_timestamp_seconds": ("gauge", "Unix time of the last serving gate run."),
    "serving_gate_info": ("gauge", "What the last serving gate run tested: release, image and model revision."),
    "release_bench_output_tokens_per_second": ("gauge", "Head: output tok/s of the release it serves in its release "
                                                        "bench after its gate, by concurrency (absent: not benched)."),
    "release_bench_ttft_p95_seconds": ("gauge", "Head: time to first token, 95th percentile, of the release it serves "
                                                "in its release bench, by concurrency."),
    "release_bench_failed_requests": ("gauge", "Head: requests that failed in its release bench, by concurrency."),
    "service_active": ("gauge", "1 if the inference systemd unit is active, else 0."),
    "endpoint_closed": ("gauge", "Head with an endpoint: 1 while its door is closed (every API request gets a JSON 503: "
                                 "a switch, or a converge stopped before its gate), else 0."),
    "endpoint_closed_since_seconds": ("gauge", "Unix time the endpoint's door closed (while it is closed)."),
    "switch_in_progress": ("gauge", "1 while a converge switches this node to another release (its marker, within the "
                                    "bound the converge wrote), else 0: planned work, not an outage."),
    "serving_release_gated": ("gauge", "Head, service active: 1 if the release it started from passed the serving gate "
                                       "here, 0 if not (a switch, or a converge killed before its gate); absent when "
                                       "the service is not active."),
    "service_restarts_total": ("counter", "Times systemd restarted the inference unit (NRestarts)."),
    "service_unplanned_restarts_total": ("counter", "Automatic restarts of the inference unit outside a converge's "
                                                    "switch (its marker in force neither now nor at the run before): "
                                                    "crashes, not planned work. Kept across runs and reboots."),
}

Run = Callable[..., subprocess.CompletedProcess]
Sample = tuple[str, dict[str, str], float]


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def render(samples: list[Sample]) -> str:
    """The text format: each family with at least one sample, its HELP and TYPE lines, then its samples."""
    lines = []
    for short, (kind, help_text) in FAMILIES.items():
        name = PREFIX + short
        rows = [(labels, value) for n, labels, value in samples if n == short]
        if not rows:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in rows:
            body = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{body}}} {format_value(value)}" if body else f"{name} {format_value(value)}")
    return "\n".join(lines) + "\n"


def output_of(run: Run, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def is_number(cell: str) -> bool:
    return bool(NUMBER.match(cell.strip()))


# --- sources: each returns samples, or raises; collect() keeps one failure from reaching the others ------------------

def module_version(module_root: str) -> str:
    """The loaded nvidia kernel module's version, or "" when none is loaded."""
    try:
        with open(os.path.join(module_root or "/", "sys/module/nvidia/version"), encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def gpu_query(run: Run, timeout: float) -> tuple[bool, str, list[dict[str, str]]]:
    """(query ok, userspace driver version or "", one dict of cells per GPU). A driver/library mismatch is not ok,
    but still names the userspace version (NVML's)."""
    argv = ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"]
    try:
        res = output_of(run, argv, timeout)
    except (OSError, subprocess.SubprocessError) as e:  # missing binary, timeout
        print(f"node_facts: nvidia-smi: {e}", file=sys.stderr)
        return False, "", []
    text = (res.stdout or "") + "\n" + (res.stderr or "")
    if res.returncode != 0:
        found = NVML_VERSION.search(text) if MISMATCH_MARK in text else None
        print(f"node_facts: nvidia-smi exit {res.returncode}: {text.strip()[:300]}", file=sys.stderr)
        return False, found.group(1) if found else "", []
    columns = GPU_QUERY.split(",")
    gpus = []
    for line in (res.stdout or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(columns):
            gpus.append(dict(zip(columns, cells)))
    userspace = next((g["driver_version"] for g in gpus if g["driver_version"]), "")
    return bool(gpus), userspace, gpus


def gpu_samples(gpus: list[dict[str, str]]) -> list[Sample]:
    """Per-GPU readings, only where the cell is a number ("[N/A]", "[Not Supported]": no series)."""
    out = []
    for gpu in gpus:
        for column, metric, convert in GPU_SERIES:
            cell = gpu.get(column, "")
            if is_number(cell):
                out.append((metric, {"gpu": gpu["index"]}, convert(float(cell))))
    return out


def driver_samples(config: dict, run: Run) -> list[Sample]:
    module = ""
    try:
        module = module_version(config.get("module_root") or "/")
    except OSError as e:
        print(f"node_facts: nvidia module version: {e}", file=sys.stderr)
    ok, userspace, gpus = gpu_query(run, config.get("smi_timeout_s") or 30)
    branch = config.get("driver_branch")
    info = {"branch": "" if branch is None else str(branch), "userspace": userspace, "module": module}
    matches = bool(ok and module and userspace == module)
    return [("driver_info", info, 1), ("driver_module_matches", {}, int(matches)),
            ("gpu_query_ok", {}, int(ok))] + gpu_samples(gpus)


def xid_kind(line: str) -> str:
    """``hardware`` for a line with one of HARDWARE_XIDS, else ``other`` (an unreadable code is not a hardware one)."""
    code = XID_CODE.search(line)
    return "hardware" if code and int(code.group(1)) in HARDWARE_XIDS else "other"


def xid_samples(run: Run) -> list[Sample]:
    """Xid lines in this boot's kernel log, by kind. journalctl exits 1, silently, when the grep matches nothing: 0.
    A journal that cannot be read (a timeout, another failure, no journalctl) gives no series: a count of 0 would
    be a claim this program cannot make, and a 0 between two counts would read as a new error."""
    try:
        res = output_of(run, ["journalctl", "-k", "-b", "-o", "cat", "--no-pager", "-g", XID_MARK], XID_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"node_facts: journalctl: {e}: no Xid series", file=sys.stderr)
        return []
    if res.returncode not in (0, 1) or (res.returncode == 1 and ((res.stdout or "").strip() or (res.stderr or "").strip())):
        print(f"node_facts: journalctl exit {res.returncode}: {(res.stderr or '').strip()[:300]}: no Xid series",
              file=sys.stderr)
        return []
    counts = {"hardware": 0, "other": 0}
    for line in (res.stdout or "").splitlines() if res.returncode == 0 else []:
        if XID_MARK in line:
            counts[xid_kind(line)] += 1
    return [("gpu_xid_errors", {"kind": kind}, count) for kind, count in counts.items()]


def free_bytes_samples(model_dir: str) -> list[Sample]:
    """Free bytes where the model lives; before the first sync, on the nearest directory that exists."""
    path = os.path.abspath(model_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return [("model_free_bytes", {}, st.f_bavail * st.f_frsize)]


def read_record(path: str) -> dict | None:
    """A JSON object written by another timer; None when absent. Unreadable raises (the caller says why)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a JSON object")
    return record


def epoch(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def deep_verify_samples(path: str) -> list[Sample]:
    record = read_record(path)
    if record is None:
        return []
    verdict = {"ok": 1, "bad": 0}.get(record.get("verdict"))
    at = epoch(record.get("at"))
    if verdict is None:
        raise ValueError(f"{path}: verdict {record.get('verdict')!r} is neither 'ok' nor 'bad'")
    # the commit it checked (the live release's: the deep verify follows the live manifest), so DeepVerifyBad names it
    commit = record.get("commit")
    labels = {"commit": commit} if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit) else {}
    return [("deep_verify_ok", labels, verdict)] + ([("deep_verify_timestamp_seconds", {}, at)] if at is not None else [])


def serving_gate_samples(path: str) -> list[Sample]:
    record = read_record(path)
    if record is None:
        return []
    if not isinstance(record.get("ok"), bool):
        raise ValueError(f"{path}: 'ok' is not true or false")
    at = epoch(record.get("at"))
    info = {k: "" if record.get(k) is None else str(record.get(k)) for k in ("release", "image", "model_revision")}
    return ([("serving_gate_ok", {}, int(record["ok"]))]
            + ([("serving_gate_timestamp_seconds", {}, at)] if at is not None else [])
            + [("serving_gate_info", info, 1)])


def switch_samples(marker: str, now: float) -> list[Sample]:
    """A converge's switch marker: ``{"until": epoch}``, written before it restarts the node's service and removed once
    the switch ended (gated, rolled back or failed); a killed converge's marker counts only until its bound."""
    record = read_record(marker)
    until = epoch((record or {}).get("until"))
    return [("switch_in_progress", {}, int(until is not None and now < until))]


def endpoint_samples(flag: str) -> list[Sample]:
    """The endpoint's door: closed while its flag exists (a converge creates it before a restart, removes it once a
    release passed the gate), since the flag's time."""
    try:
        since = os.stat(flag).st_mtime
    except FileNotFoundError:
        return [("endpoint_closed", {}, 0)]
    return [("endpoint_closed", {}, 1), ("endpoint_closed_since_seconds", {}, since)]


def gated_samples(run: Run, service: str, started_from: str, gate_passed: str) -> list[Sample]:
    """Whether the active service runs the release the head's gate last passed: the unit and environments its start
    recorded (``started_from``'s first line) are those of the gate's record (``gate_passed``: "unit"). A restart by
    systemd of the same release stays gated; a converge removes the record before it restarts onto another."""
    if systemctl_property(run, service, "ActiveState") != "active":
        return []
    try:
        with open(started_from, encoding="utf-8") as f:
            started = f.readline().strip()
    except OSError:
        started = ""
    record = read_record(gate_passed) or {}
    return [("serving_release_gated", {}, int(bool(started) and record.get("unit") == started))]


def systemctl_property(run: Run, service: str, prop: str) -> str:
    res = output_of(run, ["systemctl", "show", "-p", prop, "--value", service], SYSTEMCTL_TIMEOUT_S)
    return (res.stdout or "").strip() if res.returncode == 0 else ""


def service_samples(run: Run, service: str) -> list[Sample]:
    out: list[Sample] = [("service_active", {}, int(systemctl_property(run, service, "ActiveState") == "active"))]
    restarts = systemctl_property(run, service, "NRestarts")
    if restarts.isdigit():
        out.append(("service_restarts_total", {}, int(restarts)))
    return out


def count_restarts(before: dict | None, restarts: int, switching: bool) -> dict:
    """The restart account after this run: ``before`` (the last run's, None: none or unreadable), systemd's NRestarts
    now, and whether a converge's switch marker is in force now. New restarts count as unplanned unless a switch was
    in progress now or at the run before (a head's vLLM exits when its workers restart for a switch, and systemd
    restarts it). A count that went down was set back (`reset-failed` by the backoff reset, a reboot): what it shows
    now is new. A first run counts nothing: what came before it is not known."""
    if before is None or not all(isinstance(before.get(k), int) for k in ("seen", "unplanned")):
        return {"seen": restarts, "unplanned": 0, "switching": switching}
    new = restarts - before["seen"] if restarts >= before["seen"] else restarts
    planned = switching or before.get("switching") is True
    return {"seen": restarts, "unplanned": before["unplanned"] + (0 if planned else new), "switching": switching}


def unplanned_restart_samples(run: Run, service: str, marker: str, account: str, now: float) -> list[Sample]:
    restarts = systemctl_property(run, service, "NRestarts")
    if not restarts.isdigit():
        return []
    try:
        before = read_record(account)
    except ValueError:
        before = None
    state = count_restarts(before, int(restarts), switch_samples(marker, now)[0][2] == 1)
    write_atomically(account, json.dumps(state, sort_keys=True) + "\n")
    return [("service_unplanned_restarts_total", {}, state["unplanned"])]


def release_bench_samples(gate_passed: str) -> list[Sample]:
    """The release bench's figures of the release the head's gate last passed (its record's "bench")."""
    record = read_record(gate_passed) or {}
    samples: list[Sample] = []
    for level in record.get("bench") or []:
        labels = {"concurrency": str(int(level["concurrency"])), "release": str(record.get("release") or "")}
        samples += [("release_bench_output_tokens_per_second", labels, float(level["output_tok_s"])),
                    ("release_bench_ttft_p95_seconds", labels, float(level["ttft_p95_ms"]) / 1000),
                    ("release_bench_failed_requests", labels, float(level["failed"]))]
    return samples


def collect(config: dict, run: Run = subprocess.run, now: Callable[[], float] = time.time) -> str:
    """Every source read once, each on its own (a failure is reported on stderr and leaves its series out), as
    the text format."""
    samples: list[Sample] = [("facts_timestamp_seconds", {}, now())]
    sources: list[tuple[str, Callable[[], list[Sample]]]] = [
        ("driver", lambda: driver_samples(config, run)),
        ("xid", lambda: xid_samples(run)),
    ]
    if config.get("model_dir"):
        sources.append(("model_dir", lambda: free_bytes_samples(config["model_dir"])))
    if config.get("deep_verify_record"):
        sources.append(("deep_verify", lambda: deep_verify_samples(config["deep_verify_record"])))
    if config.get("gate_last"):  # null on workers: the gate runs on the head only
        sources.append(("serving_gate", lambda: serving_gate_samples(config["gate_last"])))
    if config.get("gate_passed"):  # heads
        sources.append(("release_bench", lambda: release_bench_samples(config["gate_passed"])))
    if config.get("service"):
        sources.append(("service", lambda: service_samples(run, config["service"])))
    if config.get("switch_marker"):
        sources.append(("switch", lambda: switch_samples(config["switch_marker"], now())))
    if config.get("service") and config.get("switch_marker") and config.get("restart_account"):
        sources.append(("restarts", lambda: unplanned_restart_samples(run, config["service"], config["switch_marker"],
                                                                      config["restart_account"], now())))
    if config.get("endpoint_closed_flag"):  # heads with an endpoint
        sources.append(("endpoint", lambda: endpoint_samples(config["endpoint_closed_flag"])))
    if config.get("service") and config.get("gate_passed") and config.get("started_from"):  # heads
        sources.append(("gated", lambda: gated_samples(run, config["service"], config["started_from"],
                                                       config["gate_passed"])))
    for name, source in sources:
        try:
            samples += source()
        except Exception as e:  # noqa: BLE001 - one bad source must not cost the others
            print(f"node_facts: {name}: {type(e).__name__}: {e}", file=sys.stderr)
    interval = epoch(config.get("interval_s"))
    if interval is not None:
        samples.append(("facts_interval_seconds", {}, interval))
    max_age = epoch(config.get("deep_verify_max_age_s"))
    if max_age is not None:
        samples.append(("deep_verify_max_age_seconds", {}, max_age))
    return render(samples)


def vllm_families(text: str) -> str:
    """The `vllm:` series of a vLLM /metrics answer (with their HELP and TYPE lines); the rest (python_*, process_*)
    would clash with node-exporter's own series of those names."""
    keep = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and len(line.split(" ", 3)) > 2 else line
        if name.startswith("vllm:"):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


VLLM_OK = PREFIX + "vllm_metrics_ok"


def vllm_metrics(url: str, timeout: float = 5.0) -> str:
    """vLLM's own metrics read on loopback (a head whose API no scraper reaches), and whether it answered
    (`inference_nodes_vllm_metrics_ok`: what a direct scrape's `up` says, for the service-down alert)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            families, ok = vllm_families(r.read().decode("utf-8", "replace")), 1
    except Exception as e:  # noqa: BLE001 - a service that is down or starting has no metrics
        print(f"node_facts: vllm: {type(e).__name__}: {e}", file=sys.stderr)
        families, ok = "", 0
    return (f"# HELP {VLLM_OK} 1 if vLLM answered /metrics on loopback at the last run, else 0.\n"
            f"# TYPE {VLLM_OK} gauge\n{VLLM_OK} {ok}\n" + families)


def write_atomically(path: str, text: str) -> None:
    """Temporary file in the same directory, fsync, rename over the old one, fsync the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: node-exporter does not run as root
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main(argv: list[str] | None = None, run: Run = subprocess.run) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the JSON config the monitoring deploy writes")
    parser.add_argument("--print", action="store_true", help="write the metrics to stdout instead of the file")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    text = collect(config, run=run)
    if args.print:
        sys.stdout.write(text)
    else:
        write_atomically(config["out"], text)
    vllm_out = config.get("vllm_out")
    if config.get("vllm_metrics_url") and vllm_out:
        write_atomically(vllm_out, vllm_metrics(config["vllm_metrics_url"]))
    elif vllm_out and os.path.exists(vllm_out):
        os.remove(vllm_out)  # a head now scraped directly (or a worker): no second copy of its series
    return 0


if __name__ == "__main__":
    sys.exit(main())
