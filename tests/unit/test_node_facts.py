"""files/monitoring/node_facts.py: the node's state as textfile-collector metrics. Every test feeds it files under
tmp_path and a fake command runner (nvidia-smi, journalctl, systemctl), and reads the text back with a small
parser; where prometheus_client is installed its parser checks the whole output as well."""

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

PROGRAM = Path(__file__).resolve().parents[2] / "files" / "monitoring" / "node_facts.py"
NOW = 1_760_000_000.5
MIB = 1048576


def load():
    spec = importlib.util.spec_from_file_location("node_facts", PROGRAM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


nf = load()

# --- a tiny reader of the text format -------------------------------------------------------------------------------

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; fails on a line that is neither a sample nor HELP/TYPE."""
    out = []
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        body, labels = m.group(2) or "", {}
        pos = 0
        while pos < len(body):
            lm = LABEL.match(body, pos)
            assert lm, f"bad labels in {line!r}"
            labels[lm.group(1)] = re.sub(r'\\[\\"n]', lambda e: UNESCAPE[e.group(0)], lm.group(2))
            pos = lm.end()
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def series(text: str, name: str) -> dict[tuple, float]:
    """name's samples keyed by their sorted label items."""
    return {tuple(sorted(labels.items())): value for n, labels, value in parse(text) if n == f"inference_nodes_{name}"}


def value(text: str, name: str, **labels) -> float | None:
    return series(text, name).get(tuple(sorted(labels.items())))


def names(text: str) -> set[str]:
    return {n.removeprefix("inference_nodes_") for n, _, _ in parse(text)}


def check_format(text: str) -> None:
    """Every sample's family has HELP and TYPE before it, each family once and contiguous; and, where installed,
    prometheus_client's own parser reads all of it."""
    seen_types, current = {}, None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in seen_types, f"family {name} twice"
            seen_types[name], current = kind, name
        elif not line.startswith("#"):
            assert SAMPLE.match(line).group(1) == current, f"{line!r} outside its family"
    assert all(f"# HELP {name} " in text for name in seen_types)
    assert all(name.startswith("inference_nodes_") for name in seen_types)


# --- a fake node ----------------------------------------------------------------------------------------------------

def done(stdout="", returncode=0, stderr=""):
    return SimpleNamespace(returncode=returncode, stdout=stdout, stderr=stderr)


SMI_TWO_GPUS = ("0, 580.95.05, 37, 312.45, 61, 0, 20480, 97871\n"
                "1, 580.95.05, 5, 88.10, 44, 2, [N/A], [N/A]\n")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95.05\n"


class FakeRun:
    """Answers by program; an exception instance as an answer is raised (missing binary, timeout)."""

    def __init__(self, smi=None, journal=None, active="active\n", restarts="3\n"):
        self.answers = {
            "nvidia-smi": done(SMI_TWO_GPUS) if smi is None else smi,
            "journalctl": done("", 1) if journal is None else journal,
            "ActiveState": done(active) if isinstance(active, str) else active,
            "NRestarts": done(restarts) if isinstance(restarts, str) else restarts,
        }
        self.calls = []

    def __call__(self, argv, **kwargs):
        self.calls.append((argv, kwargs))
        assert kwargs.get("timeout"), f"{argv[0]} run without a timeout"
        key = argv[3] if argv[0] == "systemctl" else argv[0]
        answer = self.answers[key]
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture
def node(tmp_path):
    """A config over tmp_path: module 580.95.05 loaded, model dir present, no records yet, a worker (no gate)."""
    root = tmp_path / "gpu"
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_text("580.95.05\n")
    (tmp_path / "models").mkdir()
    return {
        "out": str(tmp_path / "metrics" / "inference_nodes.prom"),
        "module_root": str(root),
        "driver_branch": "580",
        "model_dir": str(tmp_path / "models"),
        "deep_verify_record": str(tmp_path / "deep-verify.json"),
        "deep_verify_max_age_s": 8 * 86400,
        "gate_last": None,
        "service": "inference.service",
        "smi_timeout_s": 20,
    }


def collect(config, run=None):
    text = nf.collect(config, run=run or FakeRun(), now=lambda: NOW)
    check_format(text)
    return text


# --- the driver and the GPUs ----------------------------------------------------------------------------------------

def test_a_matched_driver_with_two_gpus_exports_every_reading_that_is_a_number(node):
    run = FakeRun()
    text = collect(node, run)
    assert value(text, "facts_timestamp_seconds") == NOW
    assert series(text, "driver_info") == {
        (("branch", "580"), ("module", "580.95.05"), ("userspace", "580.95.05")): 1}
    assert value(text, "driver_module_matches") == 1 and value(text, "gpu_query_ok") == 1
    assert series(text, "gpu_utilization_ratio") == {(("gpu", "0"),): 0.37, (("gpu", "1"),): 0.05}
    assert series(text, "gpu_power_watts") == {(("gpu", "0"),): 312.45, (("gpu", "1"),): 88.10}
    assert series(text, "gpu_temperature_celsius") == {(("gpu", "0"),): 61, (("gpu", "1"),): 44}
    assert series(text, "gpu_ecc_uncorrected_errors") == {(("gpu", "0"),): 0, (("gpu", "1"),): 2}
    # GPU 1 reports its memory as [N/A] (as GB10 does): no series for it, rather than a 0 that claims no memory
    assert series(text, "gpu_memory_used_bytes") == {(("gpu", "0"),): 20480 * MIB}
    assert series(text, "gpu_memory_total_bytes") == {(("gpu", "0"),): 97871 * MIB}
    smi = next(argv for argv, kw in run.calls if argv[0] == "nvidia-smi")
    assert smi == ["nvidia-smi", "--query-gpu=index,driver_version,utilization.gpu,power.draw,temperature.gpu,"
                   "ecc.errors.uncorrected.volatile.total,memory.used,memory.total", "--format=csv,noheader,nounits"]
    assert next(kw["timeout"] for argv, kw in run.calls if argv[0] == "nvidia-smi") == 20


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "nan", "inf", "", "1_0"])
def test_a_cell_that_is_not_a_number_leaves_its_series_out(node, cell):
    run = FakeRun(smi=done(f"0, 580.95.05, {cell}, {cell}, {cell}, {cell}, {cell}, {cell}\n"))
    text = collect(node, run)
    assert not names(text) & {"gpu_utilization_ratio", "gpu_power_watts", "gpu_temperature_celsius",
                              "gpu_ecc_uncorrected_errors", "gpu_memory_used_bytes", "gpu_memory_total_bytes"}
    assert value(text, "gpu_query_ok") == 1 and value(text, "driver_module_matches") == 1


def test_a_driver_library_mismatch_names_the_userspace_version_from_nvml_and_does_not_match(node, tmp_path):
    (tmp_path / "gpu/sys/module/nvidia/version").write_text("580.82.07\n")  # the old module is still loaded
    text = collect(node, FakeRun(smi=done(MISMATCH, returncode=18)))
    assert series(text, "driver_info") == {
        (("branch", "580"), ("module", "580.82.07"), ("userspace", "580.95.05")): 1}
    assert value(text, "driver_module_matches") == 0
    assert value(text, "gpu_query_ok") == 0
    assert not {n for n in names(text) if n.startswith("gpu_") and n not in ("gpu_query_ok", "gpu_xid_errors")}


def test_a_mismatch_message_on_stderr_is_read_too(node):
    text = collect(node, FakeRun(smi=done("", returncode=18, stderr=MISMATCH)))
    assert value(text, "driver_info", branch="580", userspace="580.95.05", module="580.95.05") == 1
    assert value(text, "driver_module_matches") == 0  # equal strings, but nvidia-smi could not talk to the module


def test_no_module_loaded_does_not_match(node, tmp_path):
    (tmp_path / "gpu/sys/module/nvidia/version").unlink()
    text = collect(node)
    assert value(text, "driver_info", branch="580", userspace="580.95.05", module="") == 1
    assert value(text, "driver_module_matches") == 0
    assert value(text, "gpu_query_ok") == 1


@pytest.mark.parametrize("failure", [FileNotFoundError(2, "No such file or directory", "nvidia-smi"),
                                     subprocess.TimeoutExpired(["nvidia-smi"], 20),
                                     done("NVIDIA-SMI has failed because it couldn't communicate", returncode=9)])
def test_nvidia_smi_missing_hung_or_failing_is_query_not_ok_and_the_rest_is_still_there(node, failure):
    text = collect(node, FakeRun(smi=failure))
    assert value(text, "gpu_query_ok") == 0 and value(text, "driver_module_matches") == 0
    assert value(text, "driver_info", branch="580", userspace="", module="580.95.05") == 1
    assert value(text, "service_active") == 1 and value(text, "gpu_xid_errors", kind="hardware") == 0
    assert value(text, "model_free_bytes") > 0


# --- the kernel log, the model filesystem, the service ---------------------------------------------------------------

def test_xid_lines_are_counted_by_kind_and_a_journal_with_none_is_zero(node):
    journal = done("NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus.\n"
                   "NVRM: Xid (PCI:0000:17:00): 48, pid=1, DBE.\nsome other line\n"
                   "NVRM: Xid (PCI:0000:17:00): 43, pid=4242, name=python3, Ch 00000008\n"
                   "NVRM: Xid (PCI:0000:65:00): 13, pid=4242, Graphics Exception\n"
                   "NVRM: Xid (PCI:0000:65:00): 119, pid=1, Timeout after 6s of waiting for RPC response from GSP!\n")
    run = FakeRun(journal=journal)
    text = collect(node, run)
    assert value(text, "gpu_xid_errors", kind="hardware") == 3 and value(text, "gpu_xid_errors", kind="other") == 2
    check_format(text)
    argv, kw = next(c for c in run.calls if c[0][0] == "journalctl")
    assert argv == ["journalctl", "-k", "-b", "-o", "cat", "--no-pager", "-g", "NVRM: Xid"] and kw["timeout"] == 10
    none = collect(node, FakeRun(journal=done("", 1)))  # grep found nothing
    assert value(none, "gpu_xid_errors", kind="hardware") == 0 and value(none, "gpu_xid_errors", kind="other") == 0


@pytest.mark.parametrize("failure", [done("", 1, "Failed to open journal: Permission denied"), done("", 2, "bad -g"),
                                     subprocess.TimeoutExpired(["journalctl"], 10), FileNotFoundError("journalctl")],
                         ids=["exit-1-with-an-error", "exit-2", "timeout", "no-journalctl"])
def test_a_journal_that_cannot_be_read_gives_no_xid_series_not_a_zero(node, failure, capsys):
    """A 0 it cannot know would page as a new error once the next read counts again (N, 0, N); no series instead."""
    text = collect(node, FakeRun(journal=failure))
    assert "gpu_xid_errors" not in names(text) and value(text, "service_active") == 1
    check_format(text)
    assert "no Xid series" in capsys.readouterr().err


def test_free_bytes_come_from_the_model_dir_or_its_nearest_existing_parent(node, tmp_path, monkeypatch):
    asked = []

    def statvfs(path):
        asked.append(path)
        return SimpleNamespace(f_bavail=1000, f_frsize=4096, f_bfree=5000)

    monkeypatch.setattr(nf.os, "statvfs", statvfs)
    assert value(collect(node), "model_free_bytes") == 1000 * 4096
    assert asked == [str(tmp_path / "models")]
    node["model_dir"] = str(tmp_path / "not-yet" / "model")
    assert value(collect(node), "model_free_bytes") == 1000 * 4096
    assert asked[-1] == str(tmp_path)


def test_service_state_and_restarts(node):
    run = FakeRun(active="active\n", restarts="3\n")
    text = collect(node, run)
    assert value(text, "service_active") == 1 and value(text, "service_restarts_total") == 3
    assert "# TYPE inference_nodes_service_restarts_total counter" in text
    assert ["systemctl", "show", "-p", "ActiveState", "--value", "inference.service"] in [a for a, _ in run.calls]
    assert ["systemctl", "show", "-p", "NRestarts", "--value", "inference.service"] in [a for a, _ in run.calls]
    text = collect(node, FakeRun(active="activating\n", restarts="[not set]\n"))
    assert value(text, "service_active") == 0 and "service_restarts_total" not in names(text)
    text = collect(node, FakeRun(active=FileNotFoundError(2, "no systemctl"), restarts=done("", 1)))
    assert "service_active" not in names(text) and value(text, "gpu_query_ok") == 1


@pytest.mark.parametrize("before, restarts, switching, unplanned", [
    (None, 5, False, 0),  # the first run: what came before it is not known
    ({"seen": 2, "unplanned": 1, "switching": False}, 4, False, 3),  # two crashes
    ({"seen": 2, "unplanned": 1, "switching": False}, 4, True, 1),  # a switch: the head exits when its workers restart
    ({"seen": 2, "unplanned": 1, "switching": True}, 3, False, 1),  # the switch just ended: its marker was there before
    ({"seen": 4, "unplanned": 1, "switching": False}, 1, False, 2),  # set back by reset-failed, then one crash
    ({"seen": 4, "unplanned": 1, "switching": False}, 4, False, 1),  # nothing new
    ({"seen": "x", "unplanned": 1}, 4, False, 0),  # an account it cannot read: starts over
])
def test_restarts_during_a_switch_are_not_counted_as_crashes(before, restarts, switching, unplanned):
    """Issue 53: InferenceServiceRestarting counts only restarts outside a converge's switch."""
    after = nf.count_restarts(before, restarts, switching)
    assert after == {"seen": restarts, "unplanned": unplanned, "switching": switching}


def test_the_unplanned_restart_account_is_kept_between_runs(node, tmp_path):
    node["switch_marker"], node["restart_account"] = str(tmp_path / "switching.json"), str(tmp_path / "account.json")
    assert value(collect(node, FakeRun(active="active\n", restarts="3\n")), "service_unplanned_restarts_total") == 0
    assert value(collect(node, FakeRun(active="active\n", restarts="5\n")), "service_unplanned_restarts_total") == 2
    (tmp_path / "switching.json").write_text(json.dumps({"until": NOW + 60}))
    text = collect(node, FakeRun(active="active\n", restarts="7\n"))
    assert value(text, "service_unplanned_restarts_total") == 2 and value(text, "switch_in_progress") == 1
    assert "# TYPE inference_nodes_service_unplanned_restarts_total counter" in text
    (tmp_path / "switching.json").unlink()
    assert value(collect(node, FakeRun(active="active\n", restarts="8\n")), "service_unplanned_restarts_total") == 2
    assert value(collect(node, FakeRun(active="active\n", restarts="9\n")), "service_unplanned_restarts_total") == 3
    assert json.loads((tmp_path / "account.json").read_text()) == {"seen": 9, "unplanned": 3, "switching": False}


# --- the records other timers leave ---------------------------------------------------------------------------------

@pytest.mark.parametrize("verdict, ok", [("ok", 1), ("bad", 0)])
def test_the_deep_verify_record(node, tmp_path, verdict, ok):
    """Its verdict carries the commit it checked (issue 52 slice 5: DeepVerifyBad names it); a record without a
    commit, or with something else there, exports the verdict without the label."""
    commit = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"
    (tmp_path / "deep-verify.json").write_text(json.dumps({"verdict": verdict, "at": 1_759_990_000, "commit": commit}))
    text = collect(node)
    assert value(text, "deep_verify_ok", commit=commit) == ok
    for other in ("ab", 'x"} 1\nevil{a="', None):
        (tmp_path / "deep-verify.json").write_text(json.dumps({"verdict": verdict, "at": 1, "commit": other}))
        assert value(collect(node), "deep_verify_ok") == ok
    (tmp_path / "deep-verify.json").write_text(json.dumps({"verdict": verdict, "at": 1_759_990_000, "commit": commit}))
    text = collect(node)
    assert value(text, "deep_verify_timestamp_seconds") == 1_759_990_000
    assert value(text, "deep_verify_max_age_seconds") == 8 * 86400


@pytest.mark.parametrize("content", [None, "{not json", '["ok"]', '{"verdict": "maybe", "at": 1}'])
def test_no_deep_verify_yet_or_an_unreadable_record_is_absent_not_zero(node, tmp_path, content):
    if content is not None:
        (tmp_path / "deep-verify.json").write_text(content)
    text = collect(node)
    assert not {"deep_verify_ok", "deep_verify_timestamp_seconds"} & names(text)
    assert value(text, "deep_verify_max_age_seconds") == 8 * 86400
    assert value(text, "driver_module_matches") == 1  # the other sources are unaffected


def gate(tmp_path, node, **record):
    path = tmp_path / "gate-last.json"
    path.write_text(json.dumps(record))
    node["gate_last"] = str(path)
    return collect(node)


def test_a_passed_serving_gate_on_the_head(node, tmp_path):
    text = gate(tmp_path, node, ok=True, at=1_759_000_000, release="r42", image="vllm/vllm-openai@sha256:abc",
                model_revision="0123abcd")
    assert value(text, "serving_gate_ok") == 1
    assert value(text, "serving_gate_timestamp_seconds") == 1_759_000_000
    assert series(text, "serving_gate_info") == {
        (("image", "vllm/vllm-openai@sha256:abc"), ("model_revision", "0123abcd"), ("release", "r42")): 1}


def test_a_failed_serving_gate_on_the_head(node, tmp_path):
    text = gate(tmp_path, node, ok=False, at=1_759_000_100, release="r43", image="img", model_revision="rev")
    assert value(text, "serving_gate_ok") == 0
    assert value(text, "serving_gate_timestamp_seconds") == 1_759_000_100
    assert value(text, "serving_gate_info", release="r43", image="img", model_revision="rev") == 1


def test_a_head_whose_gate_has_not_run_and_a_worker_have_no_gate_series(node, tmp_path):
    node["gate_last"] = str(tmp_path / "never-written.json")
    assert not {n for n in names(collect(node)) if n.startswith("serving_gate")}
    node["gate_last"] = None
    text = collect(node)
    assert "serving_gate" not in text  # not even HELP/TYPE lines
    assert value(text, "service_active") == 1


def test_a_hostile_label_value_is_escaped(node, tmp_path):
    image = 'evil"} 1\ninference_nodes_serving_gate_ok 1\\'
    text = gate(tmp_path, node, ok=False, at=1, release="r", image=image, model_revision="m")
    assert 'image="evil\\"} 1\\ninference_nodes_serving_gate_ok 1\\\\"' in text
    assert series(text, "serving_gate_ok") == {(): 0}  # the injected sample did not become a line of its own
    assert value(text, "serving_gate_info", release="r", image=image, model_revision="m") == 1
    assert nf.escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_prometheus_client_reads_the_whole_output(node, tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")
    (tmp_path / "deep-verify.json").write_text(json.dumps({"verdict": "ok", "at": 1_759_990_000}))
    text = gate(tmp_path, node, ok=True, at=1, release="r", image='a"b\\c\nd', model_revision="m")
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["inference_nodes_service_restarts"].type == "counter"
    info = families["inference_nodes_serving_gate_info"].samples[0]
    assert info.labels["image"] == 'a"b\\c\nd'
    assert sum(len(f.samples) for f in families.values()) == len(parse(text))


# --- the program ----------------------------------------------------------------------------------------------------

def test_main_writes_the_file_atomically(node, tmp_path):
    config = tmp_path / "node-facts.json"
    config.write_text(json.dumps(node))
    out = Path(node["out"])
    assert not out.parent.exists()
    assert nf.main(["--config", str(config)], run=FakeRun()) == 0
    assert os.listdir(out.parent) == ["inference_nodes.prom"]  # no temporary file left behind
    assert out.stat().st_mode & 0o777 == 0o644 and out.parent.stat().st_mode & 0o777 == 0o755 & ~_umask()
    first = out.read_text()
    check_format(first)
    assert value(first, "driver_module_matches") == 1 and value(first, "gpu_xid_errors", kind="other") == 0
    old_inode = out.stat().st_ino
    assert nf.main(["--config", str(config)], run=FakeRun(smi=done(MISMATCH, returncode=18))) == 0
    assert os.listdir(out.parent) == ["inference_nodes.prom"]
    assert out.stat().st_ino != old_inode  # replaced by a rename, never rewritten in place
    assert value(out.read_text(), "driver_module_matches") == 0


def test_main_print_writes_stdout_and_not_the_file(node, tmp_path, capsys):
    config = tmp_path / "node-facts.json"
    config.write_text(json.dumps(node))
    assert nf.main(["--config", str(config), "--print"], run=FakeRun()) == 0
    text = capsys.readouterr().out
    check_format(text)
    assert value(text, "gpu_query_ok") == 1
    assert not Path(node["out"]).exists()


def test_main_survives_a_node_with_nothing_to_report(tmp_path):
    """No GPU, no journal, no systemd, no records: the file is still written, with what could be said."""
    config = {"out": str(tmp_path / "m" / "x.prom"), "module_root": str(tmp_path / "nothing"), "driver_branch": None,
              "model_dir": str(tmp_path / "models"), "deep_verify_record": str(tmp_path / "nope.json"),
              "deep_verify_max_age_s": 3600, "gate_last": None, "service": "inference.service", "smi_timeout_s": 5}
    (tmp_path / "c.json").write_text(json.dumps(config))

    def run(argv, **kw):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    assert nf.main(["--config", str(tmp_path / "c.json")], run=run) == 0
    text = (tmp_path / "m" / "x.prom").read_text()
    check_format(text)
    assert names(text) == {"facts_timestamp_seconds", "driver_info", "driver_module_matches", "gpu_query_ok",
                           "model_free_bytes", "deep_verify_max_age_seconds"}  # no journal: no Xid count claimed
    assert value(text, "driver_info", branch="", userspace="", module="") == 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_vllm_families_keep_only_vllm_series():
    """A head whose vLLM no scraper reaches hands node-exporter its `vllm:` series only: python_* and process_*
    would clash with node-exporter's own."""
    text = ("# HELP python_gc_objects_collected_total Objects collected\n# TYPE python_gc_objects_collected_total counter\n"
            'python_gc_objects_collected_total{generation="0"} 5.0\n'
            "# HELP vllm:num_requests_running Running\n# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
            "# HELP process_cpu_seconds_total CPU\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n")
    out = nf.vllm_families(text)
    assert out.splitlines() == ["# HELP vllm:num_requests_running Running", "# TYPE vllm:num_requests_running gauge",
                                'vllm:num_requests_running{engine="0",model_name="m"} 1.0']
    assert nf.vllm_families("python_info 1\n") == ""


def test_vllm_metrics_say_whether_vllm_answered_on_loopback():
    """A head scraped through its node-exporter: vLLM not answering is a series (0), not just missing series."""
    from tests.unit.local_http import serving

    body = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.0\nprocess_open_fds 9\n"
    with serving(lambda: body) as port:
        text = nf.vllm_metrics(f"http://127.0.0.1:{port}/metrics")
    assert value(text, "vllm_metrics_ok") == 1.0
    assert "vllm:num_requests_running 2.0" in text.splitlines() and "process_open_fds" not in text
    down = nf.vllm_metrics(f"http://127.0.0.1:{port}/metrics", timeout=2)
    assert value(down, "vllm_metrics_ok") == 0.0 and "vllm:" not in down


def test_a_head_serving_a_release_its_gate_did_not_pass_says_so(node, tmp_path):
    """The unit and environments the running start recorded against the gate's record: equal is gated (a restart by
    systemd of the same release too); another, or no record (a converge removed it before its restart and was killed
    before its gate), is not; a service that is not active says nothing (the service-down alert's)."""
    started, passed = tmp_path / "started-from", tmp_path / "gate-passed.json"
    node.update(started_from=str(started), gate_passed=str(passed))
    started.write_text("a" * 64 + "\n" + "b" * 64 + "\n")
    passed.write_text(json.dumps({"release": "r42", "unit": "a" * 64}))
    assert value(collect(node, FakeRun(active="active\n")), "serving_release_gated") == 1
    passed.write_text(json.dumps({"release": "r41", "unit": "c" * 64}))
    assert value(collect(node, FakeRun(active="active\n")), "serving_release_gated") == 0
    passed.unlink()
    assert value(collect(node, FakeRun(active="active\n")), "serving_release_gated") == 0
    assert "serving_release_gated" not in names(collect(node, FakeRun(active="inactive\n")))
    node.update(started_from=None, gate_passed=None)  # a worker: no gate, no series
    assert "serving_release_gated" not in names(collect(node, FakeRun(active="active\n")))


def test_a_converges_switch_marker_counts_until_its_bound(node, tmp_path):
    marker = tmp_path / "grandpa.switching.json"
    node["switch_marker"] = str(marker)
    assert value(collect(node), "switch_in_progress") == 0  # none
    marker.write_text(json.dumps({"until": NOW + 600}))
    assert value(collect(node), "switch_in_progress") == 1
    marker.write_text(json.dumps({"until": NOW - 1}))  # a killed converge's marker, past its bound
    assert value(collect(node), "switch_in_progress") == 0


def test_the_endpoints_door_is_exported_while_its_flag_exists_with_its_time(node, tmp_path):
    """N2: a door shut by a converge that was stopped is visible (EndpointClosed reads it); a head without an
    endpoint, or a worker, has no such series."""
    import os

    assert "endpoint_closed" not in names(collect(node))  # no endpoint here
    flag = tmp_path / "grandpa.closed"
    node["endpoint_closed_flag"] = str(flag)
    assert value(collect(node), "endpoint_closed") == 0
    assert "endpoint_closed_since_seconds" not in names(collect(node))
    flag.touch()
    os.utime(flag, (NOW - 300, NOW - 300))
    assert value(collect(node), "endpoint_closed") == 1
    assert value(collect(node), "endpoint_closed_since_seconds") == NOW - 300


def test_the_release_bench_figures_of_the_release_that_serves_are_series(node, tmp_path):
    passed = tmp_path / "gate-passed.json"
    node.update(gate_passed=str(passed))
    passed.write_text(json.dumps({"release": "r42", "unit": "a" * 64}))
    assert not {n for n in names(collect(node)) if n.startswith("release_bench")}  # not benched: no series
    passed.write_text(json.dumps({"release": "r42", "unit": "a" * 64, "bench": [
        {"concurrency": 1, "output_tok_s": 72.3, "ttft_p95_ms": 226.0, "failed": 0},
        {"concurrency": 16, "output_tok_s": 343.0, "ttft_p95_ms": 1250.0, "failed": 1}]}))
    text = collect(node)
    assert value(text, "release_bench_output_tokens_per_second", concurrency="16", release="r42") == 343.0
    assert value(text, "release_bench_ttft_p95_seconds", concurrency="1", release="r42") == 0.226
    assert value(text, "release_bench_failed_requests", concurrency="16", release="r42") == 1
