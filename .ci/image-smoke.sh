#!/usr/bin/env bash
# Build ./Dockerfile and check that the image serves the API, without a Docker
# engine or a container registry:
#   - podman (daemonless) with runc, storage kept in $IMAGE_CI_DIR;
#   - a local stand-in for python:3.11-slim built from Debian bookworm packages
#     with mmdebstrap (no base image can be pulled here), passed as BASE_IMAGE;
#   - the container runs on the host network namespace, so it only listens on
#     this machine: no bridge, no iptables rules, no ip_forward change.
# Then: GET /healthz must answer {"status":"ok"} and POST /plan with
# examples/smoke-plan.json must return an "optimal"/"feasible" result with plans.
#
# Environment:
#   IMAGE_CI_DIR             storage and cache folder (default /tmp/image-ci); the
#                            stand-in base image and the build's layer cache are kept
#                            there, so later runs skip rebuilding them.
#   IMAGE_CI_STORAGE_DRIVER  "overlay" or "vfs"; by default overlay when the kernel
#                            allows it (several times faster here), else vfs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
W=${IMAGE_CI_DIR:-/tmp/image-ci}
BASE=localhost/pybase:3.11
IMG=localhost/parallelism-planner:ci
CTR=parallelism-planner-smoke
PLAN_BODY="$ROOT/examples/smoke-plan.json"

say() { echo "[image-smoke] $(date +%T) $*"; }
fail() {
  say "FAIL: $*"
  echo "----- podman logs $CTR -----"
  podman logs "$CTR" 2>&1 | tail -n 200 || true
  echo "----------------------------"
  exit 1
}

# ---------------------------------------------------------------- tools
missing=() # Debian package names; each is also the command it provides
for tool in podman runc mmdebstrap curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ -s /etc/ssl/certs/ca-certificates.crt ]] || missing+=(ca-certificates)
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "podman, runc, mmdebstrap, curl already installed"
fi

# ---------------------------------------------------------------- podman config
# crun cannot start containers on this kind of machine (hybrid cgroups, no
# CAP_SYS_RESOURCE), so use runc with rlimits no higher than the shell's own.
clamp() { # clamp LIMIT MAX -> min(LIMIT, MAX), "unlimited" counts as MAX
  if [[ $1 == unlimited ]] || (($1 > $2)); then echo "$2"; else echo "$1"; fi
}
NOFILE=$(clamp "$(ulimit -Hn)" 4096)
NPROC=$(clamp "$(ulimit -Hu)" 4096)

mkdir -p "$W"
# Mounts under $W exist only while podman works; any left here come from a run
# that was killed, so release them before reusing the folder.
awk -v w="$W/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null || true; done
# Runtime state lives under $W too; it only matters while a container runs, so
# start from a clean one (this also covers a reboot between runs).
rm -rf "$W/run" "$W/tmp"
mkdir -p "$W/run" "$W/tmp" "$W/networks"
cat >"$W/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=${NOFILE}:${NOFILE}", "nproc=${NPROC}:${NPROC}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$W/tmp"
[network]
network_config_dir = "$W/networks"
CONF
export CONTAINERS_CONF="$W/containers.conf"
export CONTAINERS_STORAGE_CONF="$W/storage.conf"
export DISABLE_HC_SYSTEMD=true # no systemd timers for the image's HEALTHCHECK
write_storage_conf() {
  cat >"$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "$1"
graphroot = "$W/storage-$1"
runroot = "$W/run"
CONF
}
DRIVER=${IMAGE_CI_STORAGE_DRIVER:-}
if [[ -z $DRIVER ]]; then
  DRIVER=overlay
  write_storage_conf overlay
  podman info >/dev/null 2>&1 || DRIVER=vfs
fi
write_storage_conf "$DRIVER"
say "podman storage driver: $DRIVER"

# podman keeps a small blob-info cache in /var/lib/containers whatever the
# storage settings; remove it at the end if this run is what created it.
[[ -e /var/lib/containers ]] && own_varlib=0 || own_varlib=1

cleanup() {
  podman rm -f -t 0 "$CTR" >/dev/null 2>&1 || true
  if ((own_varlib)); then rm -rf /var/lib/containers; fi
}
trap cleanup EXIT
podman rm -f -t 0 "$CTR" >/dev/null 2>&1 || true # left over from an interrupted run

# ---------------------------------------------------------------- base image
if podman image exists "$BASE"; then
  say "stand-in base $BASE already in $W"
else
  say "build stand-in for python:3.11-slim from Debian bookworm packages"
  # The host's extra CA certificates (if any) are copied in so that pip inside
  # the build can reach the package index; this only affects the CI stand-in.
  # The hooks are single-quoted on purpose: mmdebstrap runs them with $1 = rootfs.
  # shellcheck disable=SC2016
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --aptopt='Apt::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='for f in /usr/local/share/ca-certificates/*.crt; do [ -e "$f" ] && cp "$f" "$1/usr/local/share/ca-certificates/"; done; chroot "$1" update-ca-certificates >/dev/null 2>&1' \
    --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
    --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
    bookworm "$W/pybase.tar" </dev/null
  podman import -q \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' "$W/pybase.tar" "$BASE" >/dev/null
  rm -f "$W/pybase.tar"
fi

# ---------------------------------------------------------------- build
say "build $IMG from $ROOT/Dockerfile"
# --format docker keeps the Dockerfile's HEALTHCHECK (the OCI format drops it).
podman build -q --format docker --isolation chroot --network host --pull=never \
  --build-arg BASE_IMAGE="$BASE" -t "$IMG" "$ROOT" >/dev/null
podman image prune -f >/dev/null 2>&1 || true # images left untagged by earlier builds

# ---------------------------------------------------------------- run
port_free() { # can something bind 0.0.0.0:$1 the way uvicorn does?
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}
# The image's HEALTHCHECK is not scheduled (no timer on the host); it is run once below.
run_opts=(-d --name "$CTR" --network host --health-interval=disable)
if port_free 8000; then
  PORT=8000
  say "run the image's own CMD on the host network (port 8000)"
  podman run "${run_opts[@]}" "$IMG" >/dev/null
else
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  say "port 8000 is busy on this host: run uvicorn on 127.0.0.1:$PORT instead of the image's CMD"
  podman run "${run_opts[@]}" "$IMG" \
    python -m uvicorn api.main:app --host 127.0.0.1 --port "$PORT" >/dev/null
fi
URL="http://127.0.0.1:$PORT"

# ---------------------------------------------------------------- probes
up=0
for _ in $(seq 1 90); do
  if curl -fsS -m 2 -o /dev/null "$URL/healthz" 2>/dev/null; then up=1; break; fi
  [[ $(podman inspect -f '{{.State.Running}}' "$CTR" 2>/dev/null) == true ]] ||
    fail "container exited before answering /healthz"
  sleep 1
done
((up)) || fail "no answer from $URL/healthz within 90 s"

curl -fsS -m 5 -o "$W/healthz.json" "$URL/healthz" || fail "GET /healthz"
python3 - "$W/healthz.json" <<'PY' || fail "GET /healthz: unexpected body"
import json, sys
body = json.load(open(sys.argv[1]))
print("[image-smoke] GET /healthz ->", json.dumps(body))
sys.exit(0 if isinstance(body, dict) and body.get("status") == "ok" else 1)
PY

if [[ $PORT == 8000 ]]; then
  podman healthcheck run "$CTR" >/dev/null 2>&1 || fail "the image's HEALTHCHECK reports unhealthy"
  say "image HEALTHCHECK: healthy"
fi

code=$(curl -sS -m 120 -o "$W/plan.json" -w '%{http_code}' -X POST \
  -H 'content-type: application/json' --data-binary "@$PLAN_BODY" "$URL/plan") ||
  fail "POST /plan: no response"
[[ $code == 200 ]] || { head -c 2000 "$W/plan.json" 2>/dev/null; echo; fail "POST /plan: HTTP $code"; }
python3 - "$W/plan.json" <<'PY' || { head -c 2000 "$W/plan.json"; echo; fail "POST /plan: unexpected body"; }
import json, sys
body = json.load(open(sys.argv[1]))
status = body.get("status") if isinstance(body, dict) else None
plans = body.get("plans") if isinstance(body, dict) else None
n = len(plans) if isinstance(plans, list) else 0
print(f"[image-smoke] POST /plan -> status={status!r}, {n} plan(s)")
sys.exit(0 if status in ("optimal", "feasible") and n > 0 else 1)
PY

say "image builds and serves /healthz and /plan: OK"
