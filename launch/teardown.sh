#!/usr/bin/env bash
# Ends what the launch scripts started: closes the dashboard tunnel (launch/tunnel.sh --background) if one
# is open, terminates the EMR cluster (--cluster-id) or the plain-EC2 Ray cluster (--ray-config), and removes
# the EMR cluster's Ray token from S3 and from this machine (create_cluster.sh recorded where it put it).
# Billing stops when the instances have terminated; --wait waits for that (EMR).
#   launch/teardown.sh --cluster-id j-XXXXXXXXXXXXX --wait
#   launch/teardown.sh --ray-config launch/ray/cluster.yaml
set -euo pipefail

prog=teardown.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  cat <<'EOF_USAGE'
usage: teardown.sh (--cluster-id ID | --ray-config FILE) [--region REGION] [--wait] [--port 8265] [--dry-run]

  --cluster-id ID     the EMR cluster (j-...) to terminate
  --ray-config FILE   the `ray up` cluster config to take down (ray down)
  --region REGION     AWS region of the EMR cluster (default: the AWS CLI's)
  --wait              wait until the EMR cluster has terminated
  --port N            the local port of a tunnel to close (default 8265)
  --dry-run           print the commands, one per line, run nothing
EOF_USAGE
}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die, show, run

cluster_id="" ray_config="" region="" wait=0 port=8265 dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --cluster-id) cluster_id=${2:?}; shift 2 ;;
    --ray-config) ray_config=${2:?}; shift 2 ;;
    --region) region=${2:?}; shift 2 ;;
    --wait) wait=1; shift ;;
    --port) port=${2:?}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see -h)" ;;
  esac
done
[[ -n $cluster_id || -n $ray_config ]] || die "--cluster-id or --ray-config is required (see -h)"
[[ -n $cluster_id && -n $ray_config ]] && die "give --cluster-id or --ray-config, not both"
[[ -z $cluster_id || $cluster_id =~ ^j-[A-Z0-9]+$ ]] || die "--cluster-id looks like j-XXXXXXXXXXXXX, not: $cluster_id"
region_opt=()
[[ -n $region ]] && region_opt=(--region "$region")

if [[ -S $HOME/.ssh/raydp_llm-tunnel-$port ]]; then
  dry=()
  [[ $dry_run == 1 ]] && dry=(--dry-run)
  "$here/tunnel.sh" --stop --port "$port" ${dry[@]+"${dry[@]}"}
fi
if [[ -n $ray_config ]]; then
  run ray down -y "$ray_config"
  exit 0
fi
run aws emr terminate-clusters --cluster-ids "$cluster_id" ${region_opt[@]+"${region_opt[@]}"}
if [[ $wait == 1 ]]; then
  run aws emr wait cluster-terminated --cluster-id "$cluster_id" ${region_opt[@]+"${region_opt[@]}"}
fi
record=$(grep -lx "CLUSTER_ID=$cluster_id" "$HOME"/.ray/raydp_llm/clusters/*/cluster.env 2>/dev/null | head -n 1 || true)
if [[ -z $record ]]; then
  echo "$prog: no record of $cluster_id in ~/.ray/raydp_llm/clusters (create_cluster.sh on this machine writes" \
    "one): remove its token by hand, aws s3 rm s3://BUCKET/PREFIX/clusters/NAME/auth_token" >&2
  exit 0
fi
token_uri=$(sed -n 's/^TOKEN_URI=//p' "$record")
token_file=$(sed -n 's/^TOKEN_FILE=//p' "$record")
run aws s3 rm --only-show-errors "$token_uri"
run rm -f "$token_file" "$record"
