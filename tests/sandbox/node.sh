#!/usr/bin/env bash
# Throwaway systemd test nodes: a Debian trixie rootfs (mmdebstrap) booted with `systemd-nspawn -b`,
# sshd on 127.0.0.1:<port>. Several may run at once; reboots are supported; `down` leaves no process.
#
#   node.sh deps                  install the host packages the harness needs (and keep Debian's
#                                 docker-registry service off: the harness runs its own on 127.0.0.1)
#   node.sh promtool              unpack (or reuse) promtool from the distribution's package; prints its path
#   node.sh nginx | amtool        the same for nginx and amtool (the unit tier's checks of rendered files)
#   node.sh build                 build (or reuse) the cached rootfs tarball
#   node.sh up NAME PORT [GPUS] [FABRIC_ADDR] [DRIVER]
#                                 boot a fresh node from the tarball (idempotent while it runs); GPUS =
#                                 how many stand-in GPUs its stand-in nvidia-smi lists (default 1);
#                                 FABRIC_ADDR: give it a stand-in RoCE sysfs tree carrying that address ('-': none);
#                                 DRIVER preinstalled: a DGX OS node, its driver preinstalled (dgx_os_node)
#   node.sh standins              build the signed stand-in NVIDIA apt repo and serve it on 127.0.0.1:8801
#   node.sh vllm-image            build (or reuse) the real-vLLM (CPU) service image and its shared read-only
#                                 image store (tests/sandbox/vllm_image.sh; up does this too); prints the digest
#   node.sh down NAME             halt it (SIGKILL of its cgroup as fallback) and delete its rootfs
#   node.sh down-all              every node this harness started
#   node.sh ssh NAME [cmd...]     a root shell on the node
#
# Why the odd flags: see the comments at each one. Everything lives under $SANDBOX_DIR.
set -euo pipefail
SANDBOX_DIR=${SANDBOX_DIR:-/var/tmp/inference-nodes-sandbox}
PKGS=systemd,systemd-sysv,dbus,openssh-server,python3,podman,nftables,aardvark-dns,iproute2,procps,ca-certificates,busybox-static
MIRROR=${SANDBOX_MIRROR:-http://deb.debian.org/debian}
# The node rootfs in use: a link to trixie-<key>.tar, the key hashing the package list and the suite's InRelease as
# the mirror publishes it today (what mmdebstrap would install), so a point release rebuilds it (build, ~30 s).
TAR=$SANDBOX_DIR/cache/trixie.tar
KEY=$SANDBOX_DIR/ssh/id_ed25519
SSHCFG=$SANDBOX_DIR/ssh/config
SHM_SIZE=${SANDBOX_SHM_SIZE:-16g}
log() { printf '[sandbox] %s\n' "$*" >&2; }

REPO=$SANDBOX_DIR/standin-repo
REPO_PORT=8801
STANDINS_VERSION=2          # bump when the stand-in packages change: the repo is rebuilt
REGISTRY=$SANDBOX_DIR/registry
REGISTRY_ADDR=127.0.0.1:5000
HUB_PORT=8802

deps() {
  local c missing=0 rc=0 own_policy=0
  for c in mmdebstrap systemd-nspawn ssh gpg apt-ftparchive dpkg-scanpackages docker-registry curl rsync; do
    command -v $c >/dev/null || missing=1; done
  /usr/bin/python3 -c 'import libtorrent' 2>/dev/null || missing=1  # the swarm's engine (files/model_snapshot/swarm.py)
  if [ $missing = 1 ]; then
    apt-get update -qq
    # policy-rc.d: the registry package must not start its own (all-interfaces) daemon on this machine
    # (a policy-rc.d already there is the machine's own: left as it is)
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap systemd-container openssh-client gpg \
      apt-utils dpkg-dev docker-registry curl rsync python3-libtorrent >/dev/null || rc=$?
    [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  fi
  registry_package_off
  return $rc
}

# Programs the unit tier hands rendered files to, taken out of the distribution's package without installing it (the
# packages would start servers on every address here): promtool (Prometheus configurations and alert rules), nginx
# (`nginx -t` of endpoint configurations), amtool (Alertmanager configurations).
# deb_tool NAME PACKAGE... PATH_IN_PACKAGE: unpack (or reuse) $SANDBOX_DIR/tools/NAME from the first package that
# downloads; prints its path.
deb_tool() {
  local name=$1 inside=${!#} tool=$SANDBOX_DIR/tools/$1; shift
  local packages=("${@:1:$#-1}")
  [ -x "$tool" ] && { echo "$tool"; return 0; }
  local w p; w=$(mktemp -d); mkdir -p "$(dirname "$tool")"
  ( cd "$w" && for p in "${packages[@]}"; do apt-get download -qq "$p" 2>/dev/null && exit 0; done
    apt-get update -qq && for p in "${packages[@]}"; do apt-get download -qq "$p" && exit 0; done; exit 1 ) >&2
  for d in "$w"/*.deb; do dpkg-deb -x "$d" "$w/x"; done
  install -m 0755 "$w/x$inside" "$tool.tmp" && mv -f "$tool.tmp" "$tool"
  rm -rf "$w"; echo "$tool"
}
promtool() { deb_tool promtool promtool prometheus /usr/bin/promtool; }
nginx_tool() { deb_tool nginx nginx /usr/sbin/nginx; }
amtool() { deb_tool amtool prometheus-alertmanager /usr/bin/amtool; }

# Debian's docker-registry package enables its own daemon (systemd unit and init script) on :5000, every
# interface, with its own config, on the next boot of this machine. The harness only needs the binary: its
# own registry (registry() below) listens on 127.0.0.1 while nodes are up and stops at down-all. So the
# package's service is stopped, disabled and masked, every time (a package upgrade re-enables nothing then).
registry_package_off() {
  dpkg-query -W -f='${Status}' docker-registry 2>/dev/null | grep -q 'ok installed' || return 0
  if [ -d /run/systemd/system ]; then systemctl stop docker-registry.service 2>/dev/null || true
  elif [ -x /etc/init.d/docker-registry ]; then /etc/init.d/docker-registry stop >/dev/null 2>&1 || true; fi
  deb-systemd-helper disable docker-registry.service >/dev/null 2>&1 || true   # remembered across upgrades
  rm -f /etc/systemd/system/multi-user.target.wants/docker-registry.service
  ln -sfn /dev/null /etc/systemd/system/docker-registry.service                # masked, with or without systemd
  [ -x /etc/init.d/docker-registry ] && { update-rc.d docker-registry disable >/dev/null 2>&1 || true; }
  return 0
}

# --- stand-ins for NVIDIA's apt repo (what the deploy sees through inventory data alone) -------------
mkdeb() {  # name version depends [path content]
  local w=$1 name=$2 version=$3 depends=$4 d
  d=$w/${name}_$version; mkdir -p "$d/DEBIAN" "$d/usr/share/doc/$name"
  { echo "Package: $name"; echo "Version: $version"; echo "Architecture: all"
    echo "Maintainer: inference-nodes sandbox <sandbox@localhost>"
    [ -n "$depends" ] && echo "Depends: $depends"
    echo "Description: sandbox stand-in for NVIDIA's $name $version"; } > "$d/DEBIAN/control"
  echo "$name $version (stand-in)" > "$d/usr/share/doc/$name/VERSION"
  if [ $# -ge 6 ]; then mkdir -p "$d$(dirname "$5")"; printf '%s\n' "$6" > "$d$5"; chmod 755 "$d$5"; fi
  dpkg-deb --root-owner-group -Zgzip -b "$d" "$w/out/${name}_${version}_all.deb" >/dev/null
}

# nvidia-smi stand-in: answers from the stand-in module state like the real one (mismatch, no driver, GPUs).
SMI='#!/bin/sh
mine=@VERSION@
loaded=$(cat /run/stand-in-gpu/sys/module/nvidia/version 2>/dev/null)
if [ -z "$loaded" ]; then echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."; exit 9; fi
if [ "$loaded" != "$mine" ]; then echo "Failed to initialize NVML: Driver/library version mismatch"; echo "NVML library version: $mine"; exit 18; fi
n=$(cat /etc/stand-in-gpus 2>/dev/null || echo 1)
fields=""
for a in "$@"; do case $a in --query-gpu=*) fields=$(echo "${a#--query-gpu=}" | tr , " ");; esac; done
[ -n "$fields" ] || { echo "stand-in nvidia-smi $mine: $n GPU(s)"; exit 0; }
i=0
while [ $i -lt $n ]; do
  row=""
  for f in $fields; do
    case $f in
      index) v=$i;; name) v="NVIDIA RTX PRO 6000 Blackwell Stand-in";; uuid) v=GPU-5a4d0000-0000-4000-8000-00000000000$i;;
      memory.total) v=97887;; compute_cap) v=12.0;; pci.bus_id) v=00000000:0$((i+1)):00.0;; driver_version) v=$mine;;
      *) v="[N/A]";;
    esac
    row="${row:+$row, }$v"
  done
  echo "$row"; i=$((i+1))
done'

# nvidia-ctk stand-in: `cdi generate` writes a spec for the stand-in GPUs of the loaded stand-in driver, like
# the real one: 1.19+ adds additionalGids (CDI 0.7.0) unless the feature flag drops them.
CTK='#!/bin/sh
version=@VERSION@
[ "$1 $2" = "cdi generate" ] || { echo "stand-in nvidia-ctk $version"; exit 0; }
out=${NVIDIA_CTK_CDI_OUTPUT_FILE_PATH:-/dev/stdout}; flags=${NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS:-}
for a in "$@"; do case $a in --output=*) out=${a#--output=};; --feature-flags=*) flags="$flags,${a#--feature-flags=}";; esac; done
drv=$(cat /run/stand-in-gpu/sys/module/nvidia/version 2>/dev/null) || { echo "nvidia-ctk: no NVIDIA driver loaded" >&2; exit 1; }
n=$(cat /etc/stand-in-gpus 2>/dev/null || echo 1)
gids=""; cdi=0.5.0
case $version in 1.1[0-8].*) ;; *) case ",$flags," in *,no-additional-gids-for-device-nodes,*) ;; *) gids=1; cdi=0.7.0;; esac;; esac
mkdir -p "$(dirname "$out")"; tmp=$out.tmp
{ echo "cdiVersion: $cdi"; echo "kind: nvidia.com/gpu"; echo "devices:"
  i=0; while [ $i -lt $n ]; do
    for name in $i GPU-5a4d0000-0000-4000-8000-00000000000$i; do
      echo "- name: \"$name\""; echo "  containerEdits:"
      [ -n "$gids" ] && echo "    additionalGids: [44]"
      echo "    deviceNodes:"; echo "    - path: /dev/nvidia$i"; echo "      hostPath: /dev/null"
    done; i=$((i+1)); done
  echo "- name: all"; echo "  containerEdits:"; echo "    deviceNodes:"; echo "    - path: /dev/nvidiactl"; echo "      hostPath: /dev/null"
  echo "containerEdits:"; echo "  env:"; echo "  - NVIDIA_VISIBLE_DEVICES=void"; echo "  mounts:"
  echo "  - hostPath: /usr/lib/stand-in-nvidia/libcuda.so.$drv"; echo "    containerPath: /usr/lib/libcuda.so.$drv"
  echo "    options: [ro, nosuid, nodev, bind]"; } > "$tmp"
mv "$tmp" "$out"'

REFRESH_SERVICE='[Unit]
Description=Refresh NVIDIA CDI specification file (stand-in of the toolkit unit)
After=stand-in-nvidia-module.service
ConditionPathExists=/usr/bin/nvidia-smi
[Service]
Type=oneshot
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecStart=/usr/bin/nvidia-ctk cdi generate
[Install]
WantedBy=multi-user.target'

REFRESH_PATH='[Unit]
Description=Trigger a CDI refresh when the (stand-in) driver changes
[Path]
PathChanged=/usr/lib/stand-in-nvidia/module-version
PathChanged=/usr/bin/nvidia-ctk
[Install]
WantedBy=multi-user.target'

standins() {
  local arch dir w key
  arch=$(uname -m); [ "$arch" = aarch64 ] && arch=sbsa
  dir=$REPO/cuda/repos/debian13/$arch            # the path NVIDIA's repo uses: <distro>/<arch>/
  tk=$REPO/libnvidia-container/stable/deb/$(dpkg --print-architecture)   # NVIDIA's toolkit repo layout
  if [ "$(cat "$REPO/.version" 2>/dev/null)" != "$STANDINS_VERSION" ] || [ ! -s "$dir/InRelease" ]; then
    rm -rf "$REPO"; mkdir -p "$dir" "$tk"; w=$(mktemp -d); mkdir "$w/out"
    for v in 580.95.05-1 590.44.01-1; do
      u=${v%-*}
      mkdeb "$w" libnvidia-compute "$v" "" "/usr/lib/stand-in-nvidia/libcuda.so.$u" "stand-in libcuda $u"
      mkdeb "$w" nvidia-kernel-open "$v" "" /usr/lib/stand-in-nvidia/module-version "$u"
      mkdeb "$w" nvidia-utils "$v" "libnvidia-compute (= $v)" /usr/bin/nvidia-smi "${SMI//@VERSION@/$u}"
      mkdeb "$w" nvidia-open "$v" "libnvidia-compute (= $v), nvidia-kernel-open (= $v), nvidia-utils (= $v)"
      mkdeb "$w" "nvidia-driver-pinning-${u%%.*}" "$v" ""
    done
    cp "$w"/out/*.deb "$dir/"; rm -rf "$w"/out/*
    for v in 1.18.2-1 1.19.1-1; do
      mkdeb "$w" libnvidia-container1 "$v" ""
      mkdeb "$w" libnvidia-container-tools "$v" "libnvidia-container1 (= $v)"
      mkdeb "$w" nvidia-container-toolkit-base "$v" "" /usr/bin/nvidia-ctk "${CTK//@VERSION@/${v%-*}}"
      d=$w/nvidia-container-toolkit-base_$v; mkdir -p "$d/usr/lib/systemd/system"
      printf '%s\n' "$REFRESH_SERVICE" > "$d/usr/lib/systemd/system/nvidia-cdi-refresh.service"
      printf '%s\n' "$REFRESH_PATH" > "$d/usr/lib/systemd/system/nvidia-cdi-refresh.path"
      dpkg-deb --root-owner-group -Zgzip -b "$d" "$w/out/nvidia-container-toolkit-base_${v}_all.deb" >/dev/null
      mkdeb "$w" nvidia-container-toolkit "$v" "nvidia-container-toolkit-base (= $v), libnvidia-container-tools (= $v)"
    done
    cp "$w"/out/*.deb "$tk/"; rm -rf "$w"
    for r in "$dir" "$tk"; do
      (cd "$r" && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null && gzip -9k Packages \
         && apt-ftparchive release . > Release)
    done
    export GNUPGHOME=$SANDBOX_DIR/gnupg; rm -rf "$GNUPGHOME"; mkdir -m700 "$GNUPGHOME"
    gpg -q --batch --passphrase '' --quick-gen-key 'inference-nodes sandbox repo <sandbox@localhost>' ed25519 sign never 2>/dev/null
    key=$(gpg --batch --with-colons --list-keys | awk -F: '$1=="fpr" {print $10; exit}')
    gpg -q --batch --armor --export "$key" > "$REPO/standin-key.asc" 2>/dev/null
    for r in "$dir" "$tk"; do gpg -q --batch --yes --clearsign -u "$key" -o "$r/InRelease" "$r/Release" 2>/dev/null; done
    echo "$key" > "$REPO/fingerprint"; echo "$STANDINS_VERSION" > "$REPO/.version"
    log "stand-in NVIDIA repo built: $dir (key $key)"
  fi
  local pid; pid=$(cat "$SANDBOX_DIR/repo-server.pid" 2>/dev/null || true)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    setsid python3 -m http.server --bind 127.0.0.1 --directory "$REPO" "$REPO_PORT" </dev/null >"$SANDBOX_DIR/repo-server.log" 2>&1 &
    echo $! > "$SANDBOX_DIR/repo-server.pid"
  fi
}

# --- a DGX OS node's preinstalled driver (GB10 profiles: nvidia_driver_source preinstalled) ---------------
# What DGX OS ships, as stand-ins: nvidia-driver-580-open with its userspace, and NVIDIA's precompiled modules
# package for the running kernel (linux-modules-nvidia-580-open-<uname -r>, which "loads" through the stand-in
# module unit) with the flavour metapackages, installed before the first boot. The node's own apt repo (DGX OS
# has one; a file: repo here) offers the next userspace release and a next kernel, so a hold that does not
# hold shows as an upgrade.
DGX_STANDINS_VERSION=1      # bump when the DGX OS stand-ins change
DGX_NEXT_KERNEL=9.9.9-9999-standin
dgx_standins() {  # prints the directory of the stand-in DGX OS repo (built once per version and kernel)
  local k dir w v u
  k=$(uname -r); dir=$SANDBOX_DIR/cache/standin-dgx-$DGX_STANDINS_VERSION-$k
  if [ ! -s "$dir/Release" ]; then
    rm -rf "$dir"; w=$(mktemp -d); mkdir -p "$w/out"
    for v in 580.95.05-0ubuntu1 580.126.09-0ubuntu1; do
      u=${v%-*}
      mkdeb "$w" libnvidia-compute-580 "$v" "" "/usr/lib/stand-in-nvidia/libcuda.so.$u" "stand-in libcuda $u"
      mkdeb "$w" nvidia-utils-580 "$v" "" /usr/bin/nvidia-smi "${SMI//@VERSION@/$u}"
      mkdeb "$w" nvidia-kernel-common-580 "$v" ""
      mkdeb "$w" nvidia-driver-580-open "$v" \
        "libnvidia-compute-580, nvidia-utils-580, nvidia-kernel-common-580, linux-modules-nvidia-580-open-nvidia-hwe-24.04"
    done
    mkdeb "$w" "linux-image-$k" 1.0-1 ""
    mkdeb "$w" "linux-modules-nvidia-580-open-$k" 1.0-1 \
      "linux-image-$k, nvidia-kernel-common-580 (<= 580.95.05-1), nvidia-kernel-common-580 (>= 580.95.05)" \
      /usr/lib/stand-in-nvidia/module-version 580.95.05
    mkdeb "$w" linux-image-nvidia-hwe-24.04 1.0-1 "linux-image-$k"
    mkdeb "$w" linux-modules-nvidia-580-open-nvidia-hwe-24.04 1.0-1 "linux-modules-nvidia-580-open-$k"
    mkdeb "$w" "linux-image-$DGX_NEXT_KERNEL" 2.0-1 ""
    mkdeb "$w" "linux-modules-nvidia-580-open-$DGX_NEXT_KERNEL" 2.0-1 \
      "linux-image-$DGX_NEXT_KERNEL, nvidia-kernel-common-580 (<= 580.126.09-1), nvidia-kernel-common-580 (>= 580.126.09)"
    mkdeb "$w" linux-image-nvidia-hwe-24.04 2.0-1 "linux-image-$DGX_NEXT_KERNEL"
    mkdeb "$w" linux-modules-nvidia-580-open-nvidia-hwe-24.04 2.0-1 "linux-modules-nvidia-580-open-$DGX_NEXT_KERNEL"
    mkdir -p "$dir.tmp"; cp "$w"/out/*.deb "$dir.tmp/"; rm -rf "$w"
    (cd "$dir.tmp" && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null && apt-ftparchive release . > Release)
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

dgx_os_node() {  # ROOT: the DGX OS driver preinstalled into a node's rootfs, before its first boot
  local root=$1 dir k
  dir=$(dgx_standins); k=$(uname -r)
  mkdir -p "$root/var/lib/standin-dgx-repo"; cp "$dir"/* "$root/var/lib/standin-dgx-repo/"
  # harness-only: the image's own repo is trusted as DGX OS trusts its repo (the deploy adds no source here)
  printf 'Types: deb\nURIs: file:/var/lib/standin-dgx-repo/\nSuites: /\nTrusted: yes\n' \
    > "$root/etc/apt/sources.list.d/standin-dgx-os.sources"
  local r=/var/lib/standin-dgx-repo v=580.95.05-0ubuntu1
  chroot "$root" dpkg -i "$r/nvidia-driver-580-open_${v}_all.deb" "$r/libnvidia-compute-580_${v}_all.deb" \
    "$r/nvidia-utils-580_${v}_all.deb" "$r/nvidia-kernel-common-580_${v}_all.deb" "$r/linux-image-${k}_1.0-1_all.deb" \
    "$r/linux-modules-nvidia-580-open-${k}_1.0-1_all.deb" "$r/linux-image-nvidia-hwe-24.04_1.0-1_all.deb" \
    "$r/linux-modules-nvidia-580-open-nvidia-hwe-24.04_1.0-1_all.deb" >/dev/null
}

# A registry on 127.0.0.1:5000 (Debian's docker-registry, no auth, loopback only) holding the vLLM image
# under each profile's production name (vllm_image.sh pushes it); nodes reach it through their
# registries.conf.d mirror entries.
registry() {
  mkdir -p "$REGISTRY/data"
  local pid; pid=$(cat "$REGISTRY/pid" 2>/dev/null || true)
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
      "$REGISTRY/data" "$REGISTRY_ADDR" > "$REGISTRY/config.yml"
    setsid docker-registry serve "$REGISTRY/config.yml" </dev/null >"$REGISTRY/log" 2>&1 &
    echo $! > "$REGISTRY/pid"
  fi
  # registry credentials the deploy copies (a sandbox-only secret: it must never appear in any output)
  [ -f "$REGISTRY/auth.json" ] || { umask 077; printf '{"auths": {"registry.home.arpa": {"auth": "%s"}}}\n' \
      "$(printf 'lab:sandbox-secret-%s' "$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" | base64)" > "$REGISTRY/auth.json"; }
}

# The service image: a real vLLM (CPU build) under every profile's image name, in the registry (the deploy's
# pull path) and in a read-only image store every node shares (so nodes find it present by digest).
. "$(dirname "$0")/vllm_image.sh"

# The known-answer model (tests/sandbox/tiny_model.py) and its scrambled twin, generated once per machine by the
# vLLM image's own python (torch, transformers), so the served model is loadable by exactly that vLLM.
tiny_models() {
  local here; here=$(cd "$(dirname "$0")" && pwd)
  local gate=$here/../../files/serving_gate
  local key; key=$(cat "$here/tiny_model.py" "$gate/serving_gate.py" "$gate/schema_subset.py" "$gate/needle.py" |
    sha256sum | cut -c1-12)
  TINY_MODELS=$VLLM_CACHE/tiny-models-$VLLM_BASE_KEY-$key
  [ -f "$TINY_MODELS/.done" ] && return
  local t0=$SECONDS d=$TINY_MODELS.tmp
  rm -rf "$d"; mkdir -p "$d"
  log "generating the known-answer tiny model and its scrambled twin (~2 min): $TINY_MODELS"
  vllm_nspawn "$VLLM_ROOTFS" --bind="$d:/out" --bind-ro="$here/tiny_model.py:/run/tiny_model.py" \
    --bind-ro="$gate/serving_gate.py:/run/serving_gate.py" --bind-ro="$gate/needle.py:/run/needle.py" \
    --bind-ro="$gate/schema_subset.py:/run/schema_subset.py" \
    --setenv=PYTHONDONTWRITEBYTECODE=1 --setenv=HF_HUB_OFFLINE=1 /bin/sh -euc '
      for v in good scrambled; do
        /opt/vllm/bin/python /run/tiny_model.py /out/$v --variant $v --gate /run/serving_gate.py --needle /run/needle.py
      done'
  touch "$d/.done"; mv "$d" "$TINY_MODELS"
  log "tiny models generated in $((SECONDS - t0)) s"
}

# The stand-in model hub (tests/sandbox/standin_hub.py, stdlib only) on 127.0.0.1:8802: the known-answer model
# at the commits the profiles pin, the scrambled one at BROKEN_COMMIT.
hub() {
  tiny_models
  local pid; pid=$(cat "$SANDBOX_DIR/hub.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "$SANDBOX_DIR/hub.models" 2>/dev/null)" != "$TINY_MODELS" ]; then
    kill "$pid"; pid=""
  fi
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    setsid python3 "$(dirname "$0")/standin_hub.py" --port "$HUB_PORT" --repo-dir "pinned=$TINY_MODELS/good" \
      --repo-dir "broken=$TINY_MODELS/scrambled" </dev/null >"$SANDBOX_DIR/hub.log" 2>&1 &
    echo $! > "$SANDBOX_DIR/hub.pid"; echo "$TINY_MODELS" > "$SANDBOX_DIR/hub.models"
    for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$HUB_PORT/api/models/x/y/revision/main" && break
      grep -q "stand-in hub on" "$SANDBOX_DIR/hub.log" 2>/dev/null && break; sleep 0.1; done
  fi
}

# The demo's alert receiver (webhook_listener.py: the sandbox inventory's webhook and dead man's switch URLs) on
# 127.0.0.1:9199, printing each notification into $SANDBOX_DIR/monitoring/webhook.log; stopped with the stand-ins
# (down-all, which the node tests run first: they listen on that port themselves).
listener() {
  local pid; pid=$(cat "$SANDBOX_DIR/webhook.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && return 0
  mkdir -p "$SANDBOX_DIR/monitoring"
  setsid python3 "$(dirname "$0")/webhook_listener.py" </dev/null >"$SANDBOX_DIR/monitoring/webhook.log" 2>&1 &
  echo $! > "$SANDBOX_DIR/webhook.pid"
  for _ in $(seq 50); do grep -q "listening on" "$SANDBOX_DIR/monitoring/webhook.log" 2>/dev/null && return 0; sleep 0.1; done
  log "the webhook listener did not start: $(cat "$SANDBOX_DIR/monitoring/webhook.log")"; return 1
}

stop_standins() {
  local p; p=$(cat "$REGISTRY/pid" 2>/dev/null || true); [ -n "$p" ] && kill "$p" 2>/dev/null; rm -f "$REGISTRY/pid"
  p=$(cat "$SANDBOX_DIR/webhook.pid" 2>/dev/null || true); [ -n "$p" ] && kill "$p" 2>/dev/null; rm -f "$SANDBOX_DIR/webhook.pid"
  p=$(cat "$SANDBOX_DIR/hub.pid" 2>/dev/null || true); [ -n "$p" ] && kill "$p" 2>/dev/null; rm -f "$SANDBOX_DIR/hub.pid"
  local pid; pid=$(cat "$SANDBOX_DIR/repo-server.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -f "$SANDBOX_DIR/repo-server.pid"; true
}

build() {
  local cache=$SANDBOX_DIR/cache release key tar old
  mkdir -p "$cache"
  if ! release=$(curl -sfL --max-time 30 "$MIRROR/dists/trixie/InRelease" | sha256sum | cut -c1-64) \
      || [ "$release" = "$(printf '' | sha256sum | cut -c1-64)" ]; then
    [ -s "$TAR" ] && { log "the mirror's trixie InRelease cannot be read: reusing $(readlink "$TAR")"; return; }
    log "the mirror's trixie InRelease cannot be read ($MIRROR) and no rootfs is cached"; return 1
  fi
  key=$(printf '%s %s' "$PKGS" "$release" | sha256sum | cut -c1-12)
  tar=trixie-$key.tar
  if [ ! -s "$cache/$tar" ]; then
    log "building rootfs (trixie as published today, ~30 s): $cache/$tar"
    mmdebstrap --quiet --variant=apt --mode=root --format=tar --include="$PKGS" \
      --customize-hook='rm -f "$1/etc/machine-id"; touch "$1/etc/machine-id"' \
      trixie "$cache/$tar.tmp" "deb $MIRROR trixie main"
    mv "$cache/$tar.tmp" "$cache/$tar"
  fi
  [ "$(readlink "$TAR" 2>/dev/null)" = "$tar" ] || { ln -sfn "$tar" "$TAR.new" && mv -T "$TAR.new" "$TAR"; }
  for old in "$cache"/trixie-*.tar; do  # superseded rootfs tarballs (a node's rootfs is its own copy)
    [ "$old" = "$cache/$tar" ] || [ ! -e "$old" ] || { rm -f "$old"; log "removed the superseded $old"; }
  done
}

sshkey() {
  mkdir -p "$SANDBOX_DIR/ssh"; chmod 700 "$SANDBOX_DIR/ssh"
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -f "$KEY" -C inference-nodes-sandbox
}

write_sshcfg() {  # one OpenSSH config for every running node (testinfra's ssh:// backend and humans)
  local tmp=$SSHCFG.tmp d name port
  : > "$tmp"
  for d in "$SANDBOX_DIR"/run/*/; do
    [ -f "$d/port" ] || continue
    name=$(basename "$d"); port=$(cat "$d/port")
    cat >> "$tmp" <<CFG
Host $name
  HostName 127.0.0.1
  Port $port
  User root
  IdentityFile $KEY
  IdentitiesOnly yes
  # throwaway test node, new host key every boot: never use these two lines for a real host
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ControlMaster auto
  ControlPath $SANDBOX_DIR/ssh/cm-%C
  ControlPersist 60
CFG
  done
  mv "$tmp" "$SSHCFG"
}

running() { local pid; pid=$(cat "$SANDBOX_DIR/run/$1/pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; }

up() {
  local name=$1 port=$2 gpus=${3:-1} fabric=${4:--} driver=${5:--} run=$SANDBOX_DIR/run/$1 root=$SANDBOX_DIR/nodes/$1 cg=/sys/fs/cgroup/unified/inference-nodes-$1
  if running "$name"; then log "$name already running"; return; fi
  clear_cgroup "$cg" || return 1
  deps; build; sshkey; standins; registry; vllm_image; hub
  rm -rf "$root" "$run"; mkdir -p "$root" "$run"
  tar -C "$root" -xf "$TAR"
  echo "$name" > "$root/etc/hostname"
  install -d -m700 "$root/root/.ssh"; install -m600 "$KEY.pub" "$root/root/.ssh/authorized_keys"
  printf 'Port %s\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' \
    "$port" > "$root/etc/ssh/sshd_config.d/sandbox.conf"
  # harness-only: this host binds the pids controller to cgroup v1, so crun must not ask for a pids limit
  mkdir -p "$root/etc/containers/containers.conf.d"
  printf '[containers]\npids_limit = 0\n' > "$root/etc/containers/containers.conf.d/90-sandbox.conf"
  vllm_node_storage "$root"      # Podman also reads the shared read-only vLLM image store (bound below)
  echo "$port" > "$run/port"
  # Stand-in GPU hardware: how many GPUs the stand-in nvidia-smi lists, and a boot unit that "loads" the
  # installed stand-in kernel module (its version) into /run, so a driver change needs a real reboot.
  echo "$gpus" > "$root/etc/stand-in-gpus"
  cat > "$root/etc/systemd/system/stand-in-nvidia-module.service" <<'UNIT'
[Unit]
Description=Sandbox stand-in: load the installed nvidia kernel module at boot
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'v=$(cat /usr/lib/stand-in-nvidia/module-version 2>/dev/null) || exit 0; mkdir -p /run/stand-in-gpu/sys/module/nvidia /run/stand-in-gpu/proc/driver/nvidia; echo "$v" > /run/stand-in-gpu/sys/module/nvidia/version; echo "NVRM version: NVIDIA UNIX Open Kernel Module for $(uname -m)  $v  Release Build  (stand-in)" > /run/stand-in-gpu/proc/driver/nvidia/version'
[Install]
WantedBy=multi-user.target
UNIT
  ln -sf /etc/systemd/system/stand-in-nvidia-module.service "$root/etc/systemd/system/multi-user.target.wants/"
  if [ "$driver" = preinstalled ]; then dgx_os_node "$root"; fi
  # What NVIDIA's own instructions leave on most GPU hosts: cuda-keyring's `.list` and the container toolkit's,
  # each Signed-By its own keyring (the stand-in key here), for the URIs the toolkit's own sources name. apt
  # refuses every source list once a second Signed-By for one URI is added (deploys/apt_sources.py).
  gpg --dearmor < "$REPO/standin-key.asc" > "$root/usr/share/keyrings/cuda-archive-keyring.gpg"
  cp "$root/usr/share/keyrings/cuda-archive-keyring.gpg" "$root/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
  echo "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] http://127.0.0.1:8801/cuda/repos/debian13/$(uname -m)/ /" \
    > "$root/etc/apt/sources.list.d/cuda-debian13-$(uname -m).list"
  echo 'deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] http://127.0.0.1:8801/libnvidia-container/stable/deb/$(ARCH) /' \
    > "$root/etc/apt/sources.list.d/nvidia-container-toolkit.list"
  # Stand-in RoCE sysfs: the fabric address's RoCE v2 GID sits at an index that differs between nodes
  # (as on real pairs), among v1 and link-local entries.
  if [ "$fabric" != - ]; then
    local t=$root/srv/stand-in-sysfs/class/infiniband/mlx5_0/ports/1 idx o1 o2 o3 o4
    IFS=. read -r o1 o2 o3 o4 <<< "$fabric"; idx=$((2 + o4 % 4))
    mkdir -p "$t/gids" "$t/gid_attrs/types"
    for i in $(seq 0 7); do
      echo "fe80:0000:0000:0000:0000:0000:0000:000$i" > "$t/gids/$i"; echo "IB/RoCE v1" > "$t/gid_attrs/types/$i"; done
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n' "$o1" "$o2" "$o3" "$o4" > "$t/gids/$idx"
    echo "RoCE v2" > "$t/gid_attrs/types/$idx"
  fi
  # The supervisor joins a cgroup of its own (two nodes must not share the root one), restarts nspawn when
  # the node reboots (exit 133) and gives every boot a fresh time namespace so /proc/uptime restarts at 0
  # (pyinfra's server.reboot waits for uptime to go down).
  cat > "$run/supervise.sh" <<'SUP'
#!/bin/bash
cg=$1; shift; mkdir -p "$cg"; echo $$ > "$cg/cgroup.procs"
# TERM goes to nspawn itself (unshare's child), which halts the node cleanly; unshare would not forward it.
trap 'kill -TERM $(ps -o pid= --ppid "$child") 2>/dev/null; wait "$child"; exit 0' TERM
while :; do
  up=$(awk '{print int($1)}' /proc/uptime)
  unshare --fork --time --boottime "-$up" --monotonic "-$up" "$@" & child=$!
  wait "$child"; rc=$?
  [ "$rc" = 133 ] || exit "$rc"
  echo "== node rebooted =="
done
SUP
  # SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1: systemd 257 hangs silently on this host's hybrid cgroups otherwise.
  # --register=no --keep-unit: the host's PID 1 is not systemd (no machined, no D-Bus).
  # --system-call-filter: podman/crun inside the node need keyctl and bpf.
  # --tmpfs=/dev/shm: nspawn's default is 10% of this machine's RAM; the node stands in for a host with
  # hundreds of GB, so give it the profile's size (a tmpfs size is a limit: nothing is allocated up front).
  setsid bash "$run/supervise.sh" "$cg" \
    env SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 systemd-nspawn -D "$root" -M "$name" -b \
      --register=no --keep-unit --console=pipe --resolv-conf=copy-host \
      --system-call-filter='@keyring bpf' --tmpfs="/dev/shm:mode=1777,size=$SHM_SIZE" \
      --bind-ro="$VLLM_STORE:$VLLM_NODE_STORE" \
      ${SANDBOX_NSPAWN_EXTRA:-} \
      </dev/null >"$run/console.log" 2>&1 &
  echo $! > "$run/pid"
  write_sshcfg
  local t0=$SECONDS
  until ssh -n -F "$SSHCFG" -o ConnectTimeout=2 "$name" 'systemctl is-system-running --wait >/dev/null 2>&1; true' 2>/dev/null; do
    running "$name" || { log "nspawn for $name died:"; cat "$run/console.log" >&2; return 1; }
    (( SECONDS - t0 > 120 )) && { log "timeout waiting for sshd on $name"; return 1; }
    sleep 0.3
  done
  log "$name up on 127.0.0.1:$port after $((SECONDS - t0)) s ($(ssh -n -F "$SSHCFG" "$name" systemctl is-system-running || true))"
}

cgprocs() { [ -d "$1" ] && find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null; true; }

# A node's cgroup subtree serves one node's life. One left by an earlier node of the same name (killed, its processes
# not yet gone when it was torn down) hands the new node's systemd cgroups already used: the pair's first start was
# SIGKILLed as it began, its unit "consumed" the old vLLM's CPU time (about one run in three). Kill what is left and
# remove the subtree, bottom up, until it is gone; fail naming it when it will not go.
clear_cgroup() {
  local cg=$1 tries=0
  while [ -d "$cg" ]; do
    [ -z "$(cgprocs "$cg")" ] || echo 1 > "$cg/cgroup.kill" 2>/dev/null || true
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$cg" ] || break
    (( tries++ < 120 )) || { log "$cg: left by an earlier node, will not go ($(cgprocs "$cg" | wc -l) process(es) in it)"; return 1; }
    sleep 0.5
  done
}

down() {
  local name=$1 run=$SANDBOX_DIR/run/$1 cg=/sys/fs/cgroup/unified/inference-nodes-$1
  ssh -F "$SSHCFG" -O exit "$name" >/dev/null 2>&1 || true
  if running "$name" && [ "${FAST_DOWN:-0}" != 1 ]; then
    kill -TERM "$(cat "$run/pid")"                       # nspawn halts the node cleanly
    for _ in $(seq 60); do running "$name" || break; sleep 0.5; done
  fi
  clear_cgroup "$cg" || true                             # halt hung (or FAST_DOWN): kill every process of the node
  rm -rf "/run/systemd/nspawn/propagate/$name" "$run" "$SANDBOX_DIR/nodes/$name"
  write_sshcfg
  log "$name down"
}

down_all() { local d; for d in "$SANDBOX_DIR"/run/*/; do [ -d "$d" ] && down "$(basename "$d")"; done; stop_standins; }

case ${1:-} in
  deps) deps; promtool >/dev/null; nginx_tool >/dev/null; amtool >/dev/null ;;
  promtool) promtool ;;
  nginx) nginx_tool ;;
  amtool) amtool ;;
  build) deps; build ;;
  up) [ $# -ge 3 ] || { echo "usage: $0 up NAME PORT [GPUS] [FABRIC_ADDR] [DRIVER]" >&2; exit 2; }
      up "$2" "$3" "${4:-1}" "${5:--}" "${6:--}" ;;
  standins) deps; standins ;;
  listener) listener ;;
  vllm-image) deps; build; registry; vllm_image; cat "$VLLM_STORE/digest" ;;
  down) [ $# -eq 2 ] || { echo "usage: $0 down NAME" >&2; exit 2; }; down "$2" ;;
  down-all) down_all ;;
  ssh) shift; name=$1; shift; exec ssh -F "$SSHCFG" "$name" "$@" ;;
  *) echo "usage: $0 deps|build|standins|listener|vllm-image|up NAME PORT [GPUS] [FABRIC] [DRIVER]|down NAME|down-all|ssh NAME [cmd]" >&2; exit 2 ;;
esac
