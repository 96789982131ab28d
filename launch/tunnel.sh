#!/usr/bin/env bash
# SSH tunnel from this machine's 127.0.0.1:PORT to the Ray dashboard on the cluster's head node, which
# listens on the head's 127.0.0.1:8265 only. Through it: the dashboard in a browser (http://127.0.0.1:8265,
# log in with the cluster's token) and `ray job submit/status/logs --address http://127.0.0.1:8265`.
#   launch/tunnel.sh --head <primary-public-dns> --key key.pem               # in the foreground; Ctrl-C ends it
#   launch/tunnel.sh --head <primary-public-dns> --key key.pem --background  # returns; ends with --stop
#   launch/tunnel.sh --stop
set -euo pipefail

prog=tunnel.sh
usage() {
  cat <<'EOF'
usage: tunnel.sh --head DNS --key KEY.pem [--user hadoop] [--port 8265] [--background] [--dry-run]
       tunnel.sh --stop [--port 8265] [--dry-run]

  --head DNS      the head (EMR primary) node's public DNS name or address
  --key FILE      the SSH private key of the cluster's EC2 key pair
  --user NAME     SSH user (default hadoop, EMR's; ec2-user for launch/ray/cluster.yaml)
  --port N        local port, and the dashboard's port on the head (default 8265)
  --background    open the tunnel and return (an SSH control socket in ~/.ssh keeps it)
  --stop          close a tunnel opened with --background
  --dry-run       print the command, run nothing
EOF
}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die, show, run

head_dns="" key="" user=hadoop port=8265 mode=foreground dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --head) head_dns=${2:?}; shift 2 ;;
    --key) key=${2:?}; shift 2 ;;
    --user) user=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --background) mode=background; shift ;;
    --stop) mode=stop; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see -h)" ;;
  esac
done
[[ $port =~ ^[0-9]+$ ]] || die "--port must be a number, not: $port"
socket=$HOME/.ssh/raydp_llm-tunnel-$port

if [[ $mode == stop ]]; then
  run ssh -S "$socket" -O exit raydp_llm-tunnel
  exit 0
fi
[[ -n $head_dns ]] || die "--head is required (see -h)"
[[ -n $key ]] || die "--key is required (see -h)"

opts=(-i "$key" -N -L "$port:127.0.0.1:$port" -o ExitOnForwardFailure=yes -o ServerAliveInterval=30
      -o StrictHostKeyChecking=accept-new)
if [[ $mode == background ]]; then
  [[ $dry_run == 1 ]] || mkdir -p "$HOME/.ssh"
  run ssh -f -M -S "$socket" "${opts[@]}" "$user@$head_dns"
else
  [[ $dry_run == 1 ]] || echo "$prog: dashboard on http://127.0.0.1:$port (Ctrl-C closes the tunnel)" >&2
  run ssh "${opts[@]}" "$user@$head_dns"
fi
