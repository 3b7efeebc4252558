"""One `--limit` for every entry point (deploys/inventory.py hosts_matching): pyinfra's rules (a group, else a glob
over host names) plus cluster names; a comma is refused and a limit that selects nothing is an error, never a
green run of nothing. Profile C's gaps outside the limit stay as they are. Ad-hoc `exec`/`fact` run on an
inventory with problems (a warning), a deploy does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from deploys.inventory import LimitError, hosts_matching, limited_hosts, load_inventory
from tests.unit.test_profile_gaps import Listener

PYINFRA = os.path.join(os.path.dirname(sys.executable), "pyinfra")
B = ["gb10-b0.lab.example", "gb10-b1.lab.example"]


def _names(hosts) -> list[str]:
    return sorted(h.name for h in hosts)


def test_the_shipped_lab_resolves_groups_clusters_hosts_and_globs():
    lab = load_inventory("inventories/lab.py")
    assert _names(hosts_matching(lab, ["gb10-dspark"])) == B           # the cluster's name
    assert _names(hosts_matching(lab, ["gb10_dspark"])) == B           # its group
    assert _names(hosts_matching(lab, ["gb10-b*"])) == B               # a glob over host names
    assert _names(hosts_matching(lab, ["rtx-pro-6000-pair", "gb10-b1.lab.example"])) == [
        "gb10-b1.lab.example", "rtx-pro-a.lab.example"]
    assert _names(limited_hosts(lab, ["lab"], ["gb10-mtp"])) == [*B, "rtx-pro-a.lab.example"]
    assert limited_hosts(lab) is None
    with pytest.raises(LimitError, match=r"--limit rtx_pro_6000_pair,gb10_dspark: pyinfra does not split a comma "
                                         r".*give one --limit per name: --limit rtx_pro_6000_pair --limit gb10_dspark"):
        hosts_matching(lab, ["rtx_pro_6000_pair,gb10_dspark"])
    with pytest.raises(LimitError, match=r"--limit gb10-dspak: no host, group or cluster .*clusters: gb10-dspark, "
                                         r"gb10-mtp, rtx-pro-6000-pair"):
        hosts_matching(lab, ["gb10-dspak"])
    with pytest.raises(LimitError, match="--exclude nope"):
        limited_hosts(lab, (), ["nope"])


def _lab_on_listeners(tmp_path, listeners: dict[str, Listener], cluster_groups: bool = True) -> str:
    """inventories/ copied, its lab's hosts pointed at listeners that count connections (C keeps its gaps)."""
    inv = tmp_path / "inventories"
    shutil.copytree("inventories", inv)

    def reach(name, **data):
        return (name, {"ssh_hostname": "127.0.0.1", "ssh_port": listeners[name].port, "ssh_connect_retries": 0, **data})

    text = textwrap.dedent(f"""
        rtx_pro_6000_pair = [{reach("rtx-pro-a.lab.example")!r}]
        gb10_dspark = [{reach(B[0], node_rank=0, fabric_address="198.51.100.20")!r},
                       {reach(B[1], node_rank=1, fabric_address="198.51.100.21")!r}]
        gb10_mtp = [{reach("spark-c0.lab.example", node_rank=0, fabric_address="198.51.100.30")!r},
                    {reach("spark-c1.lab.example", node_rank=1, fabric_address="198.51.100.31")!r}]
    """)
    if cluster_groups:
        text += "\nfrom deploys.inventory import with_cluster_groups\n\nwith_cluster_groups(globals())\n"
    (inv / "lab.py").write_text(text)
    return str(inv / "lab.py")


def test_the_deploys_limit_through_the_real_cli(tmp_path):
    names = ["rtx-pro-a.lab.example", *B, "spark-c0.lab.example", "spark-c1.lab.example"]
    listeners = {name: Listener() for name in names}
    lab = _lab_on_listeners(tmp_path, listeners)

    def run(*args):
        before = {name: listener.accepted for name, listener in listeners.items()}
        proc = subprocess.run([PYINFRA, "-y", lab, *args], capture_output=True, text=True, timeout=120)
        reached = sorted(name for name, listener in listeners.items() if listener.accepted > before[name])
        return proc, proc.stdout + proc.stderr, reached

    try:
        # the README's "deploy one cluster": its members, and C's gaps outside it do not refuse the run
        proc, out, reached = run("deploys/all.py", "--limit", "gb10-dspark")
        assert reached == B, out
        assert "inventory validation failed" not in out and "model_revision" not in out
        proc, out, reached = run("deploys/all.py", "--limit", "gb10-dspark", "--limit", "rtx_pro_6000_pair")
        assert reached == [*B, "rtx-pro-a.lab.example"], out
        # a comma (pyinfra would select nothing and exit 0) and a name that selects nothing: exit 1, no connection
        proc, out, reached = run("deploys/all.py", "--limit", "rtx_pro_6000_pair,gb10_dspark")
        assert proc.returncode == 1 and reached == [], out
        assert "give one --limit per name: --limit rtx_pro_6000_pair --limit gb10_dspark" in out
        proc, out, reached = run("deploys/all.py", "--limit", "gb10-dspak")
        assert proc.returncode == 1 and reached == [] and "--limit gb10-dspak: no host, group or cluster" in out, out
        proc, out, reached = run("deploys/all.py", "--exclude", "gb10-dspak")
        assert proc.returncode == 1 and reached == [] and "--exclude gb10-dspak" in out, out
        # a deploy of the whole lab is refused on C's gaps; an ad-hoc command runs anyway, with the problems shown
        proc, out, reached = run("deploys/all.py")
        assert proc.returncode == 1 and reached == [] and "spark-c0.lab.example: key 'model_revision'" in out, out
        proc, out, reached = run("exec", "--", "uptime")
        assert reached == sorted(names), out
        assert "spark-c0.lab.example: key 'model_revision'" in out and "exec runs anyway" in out
        proc, out, reached = run("fact", "server.Hostname", "--limit", "gb10_mtp")
        assert reached == ["spark-c0.lab.example", "spark-c1.lab.example"], out
        assert "fact runs anyway" in out
    finally:
        for listener in listeners.values():
            listener.sock.close()


def test_a_cluster_name_pyinfra_would_not_know_is_refused_naming_the_fix(tmp_path):
    """An inventory without with_cluster_groups: pyinfra's own limit would select nothing for a cluster's name."""
    listeners = {name: Listener() for name in ["rtx-pro-a.lab.example", *B, "spark-c0.lab.example",
                                               "spark-c1.lab.example"]}
    lab = _lab_on_listeners(tmp_path, listeners, cluster_groups=False)
    try:
        proc = subprocess.run([PYINFRA, "-y", lab, "deploys/all.py", "--limit", "gb10-dspark"], capture_output=True,
                              text=True, timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1 and all(listener.accepted == 0 for listener in listeners.values()), out
        assert "--limit gb10-dspark: cluster gb10-dspark is not a pyinfra group" in out
        assert "with_cluster_groups(globals())" in out
    finally:
        for listener in listeners.values():
            listener.sock.close()


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)


def test_validate_render_and_audit_take_the_same_limit(tmp_path):
    ok = _run("deploys.validate", "inventories/lab.py", "--limit", "gb10-dspark")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [f"{B[0]}: valid (cluster gb10-dspark, rank 0)",
                                      f"{B[1]}: valid (cluster gb10-dspark, rank 1)"]
    whole = _run("deploys.validate", "inventories/lab.py")
    assert whole.returncode == 1 and "spark-c0.lab.example: key 'model_revision'" in whole.stderr
    comma = _run("deploys.validate", "inventories/lab.py", "--limit", "gb10_dspark,gb10_mtp")
    assert comma.returncode == 1 and "--limit gb10_dspark --limit gb10_mtp" in comma.stderr

    rendered = _run("deploys.render", "inventories/lab.py", str(tmp_path / "out"), "--limit", "gb10_dspark")
    assert rendered.returncode == 0, rendered.stderr
    assert sorted(os.listdir(tmp_path / "out")) == B
    nothing = _run("deploys.render", "inventories/lab.py", str(tmp_path / "none"), "--limit", "gb10-dspak")
    assert nothing.returncode == 1 and "--limit gb10-dspak: no host, group or cluster" in nothing.stderr
    assert not os.path.exists(tmp_path / "none")

    audit = _run("pytest", "tests/audit", "--inventory", "inventories/lab.py", "--limit", "gb10-dspark",
                 "--collect-only", "-q", "-p", "no:cacheprovider")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    ids = [line for line in audit.stdout.splitlines() if "::" in line]
    assert ids and all(any(name in i for name in B) for i in ids), ids[:5]
    assert any(B[0] in i for i in ids) and any(B[1] in i for i in ids)
    empty = _run("pytest", "tests/audit", "--inventory", "inventories/lab.py", "--limit", "gb10-dspak",
                 "--collect-only", "-q", "-p", "no:cacheprovider")
    assert empty.returncode != 0 and "--limit gb10-dspak: no host, group or cluster" in empty.stdout + empty.stderr


def test_a_limited_run_from_a_control_node_without_the_other_profiles_files(tmp_path):
    """A second admin's laptop, a B-only lab copy: profile A's endpoint files are not on this control node. A run
    limited to B validates, renders and deploys (A's missing files are warned, never a refusal); the whole lab is
    refused, naming A's keys."""
    empty = tmp_path / "no-endpoint-files"
    empty.mkdir()
    env = {**os.environ, "INFERENCE_NODES_ENDPOINT_DIR": str(empty)}

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, env=env)

    ok = run("deploys.validate", "inventories/lab.py", "--limit", "gb10-dspark")
    assert ok.returncode == 0, ok.stderr
    assert "rtx-pro-a.lab.example: key 'endpoint_tls_cert'" in ok.stderr and "outside this run's limit" in ok.stderr
    whole = run("deploys.validate", "inventories/lab.py", "--limit", "rtx_pro_6000_pair")
    assert whole.returncode == 1 and "rtx-pro-a.lab.example: key 'endpoint_clients_file'" in whole.stderr
    rendered = run("deploys.render", "inventories/lab.py", str(tmp_path / "out"), "--limit", "gb10_dspark")
    assert rendered.returncode == 0, rendered.stderr
    assert sorted(os.listdir(tmp_path / "out")) == B

    listeners = {name: Listener() for name in ["rtx-pro-a.lab.example", *B, "spark-c0.lab.example",
                                               "spark-c1.lab.example"]}
    lab = _lab_on_listeners(tmp_path, listeners)
    try:
        proc = subprocess.run([PYINFRA, "-y", lab, "deploys/all.py", "--limit", "gb10-dspark"], capture_output=True,
                              text=True, timeout=120, env=env)
        out = proc.stdout + proc.stderr
        assert "inventory validation failed" not in out, out
        assert sorted(n for n, listener in listeners.items() if listener.accepted) == B, out
    finally:
        for listener in listeners.values():
            listener.sock.close()
