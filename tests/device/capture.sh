#!/usr/bin/env bash
# On the lent GPU machine: capture raw driver outputs as fixtures, then run our facts and preflight
# through `pyinfra @local`. Writes $OUT/fixtures.tar.gz and $OUT/log.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
F=$(mktemp -d)/real-h200; mkdir -p "$F"
Q=index,name,uuid,memory.total,compute_cap,pci.bus_id,driver_version
{
  echo "== uname"; uname -a; cat /etc/os-release
  nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits > "$F/nvidia-smi-query.csv" 2>&1; echo "query rc=$?"
  nvidia-smi -q -x > "$F/nvidia-smi-q.xml" 2>&1; echo "xml rc=$?"
  nvidia-smi > "$F/nvidia-smi.txt" 2>&1
  cat /proc/driver/nvidia/version > "$F/proc-driver-nvidia-version" 2>&1; echo "proc rc=$?"
  cat /sys/module/nvidia/version > "$F/sys-module-nvidia-version" 2>&1; echo "sys rc=$?"
  { dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\n'; echo '--holds'; apt-mark showhold; } > "$F/dpkg-query-and-holds.txt" 2>&1
  grep -i -E 'nvidia|libnvidia|cuda-drivers' "$F/dpkg-query-and-holds.txt" | head -20
  modinfo nvidia 2>&1 | head -5; ls /sys/module | grep -i nvidia; ls /usr/local/nvidia 2>&1 | head
  for fact in NvidiaSmiGpus NvidiaKernelModule NvidiaDriverPackages; do
    echo "== fact $fact"; python3 -c "import sys; from pyinfra_cli.main import main; sys.argv[0] = \"pyinfra\"; sys.exit(main())" -y @local fact facts.nvidia.$fact 2>&1 | tail -40
  done
  echo "== preflight"; python3 -c "import sys; from pyinfra_cli.main import main; sys.argv[0] = \"pyinfra\"; sys.exit(main())" -y tests/device/inventory.py deploys.preflight.preflight 2>&1
  echo "== preflight rc=$?"
  echo "== unit tests"; python3 -m pytest -q -p no:cacheprovider tests/unit 2>&1 | tail -5
} > "$OUT/log.txt" 2>&1
tar -C "$(dirname "$F")" -czf "$OUT/fixtures.tar.gz" real-h200
