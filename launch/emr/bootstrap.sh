#!/usr/bin/env bash
# EMR bootstrap action (EMR 7.x: Amazon Linux 2023, Java 17, Python 3.11): runs on every node of the cluster.
#   1. installs raydp_llm and its pinned stack into a virtual environment on /mnt (the CPU torch wheel,
#      or the CUDA one on GPU instances) from a copy of the source on S3 (--source);
#   2. copies the cluster's Ray token from S3 (--token-uri) to ~/.ray/auth_token (Ray's token auth);
#   3. returns, leaving a background process that waits until EMR has provisioned the node and then runs
#      `ray start --head` on the primary node, or `ray start --address <primary>:6379` on core/task nodes,
#      through `python -m raydp_llm.node`, which puts a JDK 17 on Ray's PATH first (Spark's executors are
#      Ray's Java workers).
# Ray gets the node's CPUs and memory minus a reserve for EMR's own daemons, keeps its session (Spark's
# shuffle and spill files among it), spilled objects and the s3:// models' copies on /mnt (--app-dir), and
# serves its dashboard on 127.0.0.1 only (reach it through an SSH tunnel: launch/tunnel.sh).
#
# Uploaded and wired in by launch/emr/create_cluster.sh. Locally, --print shows the `ray start` command it
# would run on a node, from EMR's metadata files (EMR_INFO_DIR, default /mnt/var/lib/info):
#   EMR_INFO_DIR=/tmp/info NODE_CPUS=8 NODE_MEM_KB=32000000 launch/emr/bootstrap.sh --print
set -euo pipefail

prog=bootstrap.sh
usage() {
  cat <<'EOF'
usage: bootstrap.sh (--source URI | --wheelhouse S3_URI) --token-uri S3_URI [options]
       bootstrap.sh --print [options]          print the `ray start` command for this node, do nothing
       bootstrap.sh --print-install [options]  print the install's commands, one a line, do nothing
       bootstrap.sh --check-provisioned        exit 0 when EMR has provisioned this node

  --source URI         the project: s3://.../raydp_llm-src.tar.gz (git archive), s3://.../*.whl, or any
                       pip requirement (git+https://..., a PyPI spec)
  --wheelhouse S3_URI  install from the wheels launch/emr/wheelhouse.sh put there, with no package index:
                       a node in a private subnet reaches S3 (through its gateway endpoint) and nothing else
  --token-uri S3_URI   the cluster's Ray auth token (one line), copied to ~/.ray/auth_token
  --head-cpus N        Ray CPUs on the primary node (default 0: it runs the driver, Spark's driver, the
                       GCS and the dashboard; training and executors go to core/task nodes)
  --reserve-cpus N     CPUs left to EMR's daemons on core/task nodes (default 1)
  --memory-percent P   share of the node's memory Ray may use, object store included (default 75)
  --torch KIND         auto | cpu | cuda (default auto: cuda when the node has an NVIDIA device); a
                       wheelhouse holds the build it was made with
  --app-dir DIR        where the venv, Ray's session, spill files and model copies go (default
                       /mnt/raydp_llm)
  --min-free-gb N      warn when the volume of --app-dir has less free space (default 50)
  -h, --help           this help

environment (for tests and debugging): EMR_INFO_DIR (instance.json, job-flow.json), EMR_STATE_FILE
(job-flow-state.txt), NODE_CPUS, NODE_MEM_KB, NODE_FREE_KB (instead of nproc, /proc/meminfo and df)
EOF
}
die() { echo "$prog: error: $*" >&2; exit 2; }

source_uri="" wheelhouse="" token_uri="" head_cpus=0 reserve_cpus=1 mem_pct=75 torch=auto app_dir=/mnt/raydp_llm mode=install
min_free_gb=50
port=6379 dashboard_port=8265
while [[ $# -gt 0 ]]; do
  case $1 in
    --source) source_uri=${2:?}; shift 2 ;;
    --wheelhouse) wheelhouse=${2:?}; shift 2 ;;
    --token-uri) token_uri=${2:?}; shift 2 ;;
    --head-cpus) head_cpus=${2:?}; shift 2 ;;
    --reserve-cpus) reserve_cpus=${2:?}; shift 2 ;;
    --memory-percent) mem_pct=${2:?}; shift 2 ;;
    --torch) torch=${2:?}; shift 2 ;;
    --app-dir) app_dir=${2:?}; shift 2 ;;
    --min-free-gb) min_free_gb=${2:?}; shift 2 ;;
    --print) mode=print; shift ;;
    --print-install) mode=print-install; shift ;;
    --check-provisioned) mode=check; shift ;;
    --start-ray) mode=start; shift ;;  # internal: the background part
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see -h)" ;;
  esac
done
[[ $torch =~ ^(auto|cpu|cuda)$ ]] || die "--torch must be auto, cpu or cuda, not: $torch"
for n in "$head_cpus" "$reserve_cpus" "$mem_pct" "$min_free_gb"; do [[ $n =~ ^[0-9]+$ ]] || die "not a whole number: $n"; done

info_dir=${EMR_INFO_DIR:-/mnt/var/lib/info}
state_file=${EMR_STATE_FILE:-/emr/instance-controller/lib/info/job-flow-state.txt}
venv=$app_dir/venv

# A top-level key of one of EMR's JSON metadata files (booleans as true/false).
json_get() {
  python3 - "$1" "$2" <<'PY'
import json, sys
value = json.load(open(sys.argv[1])).get(sys.argv[2])
print("" if value is None else str(value).lower() if isinstance(value, bool) else value)
PY
}

# The `ray start` command for this node, one word per line (read into an array).
ray_start_words() {
  [[ -r $info_dir/instance.json ]] || die "no $info_dir/instance.json (not an EMR node? set EMR_INFO_DIR)"
  local cpus mem_kb ray_bytes store_bytes is_master
  cpus=${NODE_CPUS:-$(nproc)}
  mem_kb=${NODE_MEM_KB:-$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)}
  ray_bytes=$((mem_kb * 1024 * mem_pct / 100))
  store_bytes=$((ray_bytes * 30 / 100))  # the object store's share; it spills to /mnt beyond that
  is_master=$(json_get "$info_dir/instance.json" isMaster)
  # raydp_llm.node is `ray start` with a JDK 17 on PATH: a raylet started without Java never hosts
  # Spark's executors (Ray's Java workers); EMR's JDK is not on PATH
  # every process Ray starts (training workers, the job's driver) copies s3:// models to the volume
  printf '%s\n' "RAY_AUTH_MODE=token" "RAYDP_LLM_MODEL_CACHE=$app_dir/models" \
    "$venv/bin/python" -m raydp_llm.node
  if [[ $is_master == true ]]; then
    printf '%s\n' --head "--port=$port" --dashboard-host=127.0.0.1 "--dashboard-port=$dashboard_port" \
      "--num-cpus=$head_cpus"
  else
    local head_dns
    head_dns=$(json_get "$info_dir/job-flow.json" masterPrivateDnsName)
    [[ -n $head_dns ]] || die "no masterPrivateDnsName in $info_dir/job-flow.json"
    cpus=$((cpus > reserve_cpus ? cpus - reserve_cpus : 1))
    printf '%s\n' "--address=$head_dns:$port" "--num-cpus=$cpus"
  fi
  # Ray's session (logs, and the RayDP executors' working and temp directories: Spark's shuffle and
  # spill files) and its spilled objects on the volume, not /tmp (a tmpfs, or the 15 GiB root volume)
  printf '%s\n' "--memory=$((ray_bytes - store_bytes))" "--object-store-memory=$store_bytes" \
    "--temp-dir=$app_dir/ray-tmp" "--object-spilling-directory=$app_dir/spill" --disable-usage-stats
}

# One line on stderr when the volume under --app-dir (Ray's session, Spark's shuffle and spill, spilled
# objects, model copies) has less than --min-free-gb free.
space_warning() {
  local dir=$app_dir free_kb
  until [[ -d $dir ]]; do dir=$(dirname "$dir"); done
  free_kb=${NODE_FREE_KB:-$(df -Pk "$dir" | awk 'NR == 2 {print $4}')}
  if ((free_kb < min_free_gb * 1024 * 1024)); then
    echo "$prog: warning: $((free_kb / 1024 / 1024)) GiB free for $app_dir, under --min-free-gb" \
      "$min_free_gb: Spark's shuffle and spill, spilled objects and model copies go there;" \
      "create the cluster with a larger volume (create_cluster.sh --volume-gb)" >&2
  fi
}

# EMR's own provisioning of this node: SUCCESSFUL once Hadoop and the other applications are set up.
provision_status() {
  [[ -r $state_file ]] || return 0
  awk '/localInstance \{/ {local = 1}
       local && /nodeProvisionCheckinRecord \{/ {record = 1}
       record && $1 == "status:" {print $2; exit}' "$state_file"
}

case $mode in
  print)
    space_warning
    words=$(ray_start_words)
    echo "${words//$'\n'/ }"
    exit 0 ;;
  check)
    status=$(provision_status)
    echo "${status:-unknown}"
    [[ $status == SUCCESSFUL ]]
    exit ;;
  start)
    # Background part: wait for EMR, start Ray (workers retry until the head is up), then keep EMR's
    # auto-termination from counting a running training job as idle time (Ray jobs are not YARN apps).
    until [[ $(provision_status) == SUCCESSFUL ]]; do sleep 10; done
    space_warning
    out=$(ray_start_words)
    mapfile -t words <<<"$out"
    echo "$(date -Is) ${words[*]}"
    export PATH="$venv/bin:$PATH"  # jobs' `python` is the venv's
    for attempt in $(seq 1 60); do
      if env "${words[@]}"; then break; fi
      [[ $attempt == 60 ]] && { echo "ray start failed 60 times; giving up" >&2; exit 1; }
      sleep 10
    done
    if [[ $(json_get "$info_dir/instance.json" isMaster) == true ]]; then
      busy='-m raydp_llm\.(train|prepare|evaluate|generate|export)'  # every command of the project
      while sleep 60; do
        if pgrep -u "$(id -u)" -f -- "$busy" >/dev/null; then
          sudo touch /emr/metricscollector/isbusy
        fi
      done
    fi
    exit 0 ;;
esac

# Install (foreground: a failure here fails the cluster's start, with this script's output in the EMR logs).
[[ -n $source_uri || -n $wheelhouse ]] || die "--source or --wheelhouse is required (see -h)"
[[ -z $wheelhouse || $wheelhouse == s3://* ]] || die "--wheelhouse takes an s3:// URI, not: $wheelhouse"
[[ $token_uri == s3://* || $mode == print-install ]] || die "--token-uri s3://... is required (see -h)"

# One step of the install: run, or with --print-install printed.
step() { if [[ $mode == print-install ]]; then echo "$*"; else "$@"; fi; }

[[ $mode == install ]] && set -x
step sudo mkdir -p "$app_dir/spill" "$app_dir/src" "$app_dir/ray-tmp" "$app_dir/models"
step sudo chown -R "$(id -un):$(id -gn)" "$app_dir"
step sh -c 'command -v python3.11 >/dev/null || sudo dnf install -y python3.11'
step python3.11 -m venv "$venv"
export PIP_CACHE_DIR=$app_dir/pip-cache PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ -n $wheelhouse ]]; then  # no index: the project and its pinned stack, torch's build among them
  step aws s3 sync --only-show-errors "$wheelhouse" "$app_dir/wheelhouse"
  step "$venv/bin/pip" install -q --no-index --find-links "$app_dir/wheelhouse" raydp_llm
else
  step "$venv/bin/pip" install -q --upgrade pip
  if [[ $torch == auto ]]; then
    torch=cpu
    grep -qs 0x10de /sys/bus/pci/devices/*/vendor && torch=cuda  # 0x10de: NVIDIA's PCI vendor id
  fi
  if [[ $torch == cpu ]]; then  # the pinned version, CPU build (no 3 GB of CUDA libraries)
    step "$venv/bin/pip" install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
  if [[ $source_uri == s3://* ]]; then
    step aws s3 cp --only-show-errors "$source_uri" "$app_dir/src/"
    source_uri=$app_dir/src/${source_uri##*/}
  fi
  step "$venv/bin/pip" install -q "$source_uri"
fi
[[ $mode == print-install ]] && exit 0
set +x  # no tracing from here on: nothing that follows may print a secret
mkdir -p ~/.ray && chmod 700 ~/.ray
(umask 077 && aws s3 cp --only-show-errors "$token_uri" ~/.ray/auth_token)

cp "$0" "$app_dir/bootstrap.sh" && chmod +x "$app_dir/bootstrap.sh"
nohup setsid "$app_dir/bootstrap.sh" --start-ray --head-cpus "$head_cpus" --reserve-cpus "$reserve_cpus" \
  --memory-percent "$mem_pct" --app-dir "$app_dir" --min-free-gb "$min_free_gb" </dev/null >>"$app_dir/ray-start.log" 2>&1 &
echo "$prog: installed; Ray starts once EMR has provisioned this node (log: $app_dir/ray-start.log)"
