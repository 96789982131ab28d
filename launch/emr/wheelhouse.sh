#!/usr/bin/env bash
# Builds the wheelhouse a cluster in a private subnet installs from (bootstrap.sh --wheelhouse): the project's
# wheel and one of every package it needs, the pinned torch build among them, uploaded to
# s3://BUCKET/PREFIX/wheelhouse/<torch>/. The nodes then reach S3 (through the subnet's gateway endpoint) and no
# package index. Run it once per release of the project, on Linux x86_64 with Python 3.11 and internet access
# (EMR 7's nodes: the wheels pip picks here are the ones they can install), e.g. on a primary node in a public
# subnet or an Amazon Linux 2023 container:
#   launch/emr/wheelhouse.sh --bucket my-bucket
#   launch/emr/create_cluster.sh ... --subnet subnet-private --wheelhouse s3://my-bucket/raydp_llm/wheelhouse/cpu/
# With --dry-run it prints the commands, one per line, and runs nothing.
set -euo pipefail

prog=wheelhouse.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  cat <<'USAGE'
usage: wheelhouse.sh --bucket BUCKET [options]

  --bucket BUCKET      S3 bucket for the wheels
  --prefix PREFIX      folder in the bucket (default raydp_llm): the wheels go to PREFIX/wheelhouse/TORCH/
  --torch KIND         cpu | cuda: the torch build the nodes get (default cpu; cuda for GPU instances)
  --source DIR         the project to build (default: this checkout)
  --dry-run            print the commands, one per line, run nothing
USAGE
}
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"  # die, show, run

bucket="" prefix=raydp_llm torch=cpu source_dir=$(cd "$here/../.." && pwd) dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bucket) bucket=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --torch) torch=${2:?}; shift 2 ;;
    --source) source_dir=${2:?}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see -h)" ;;
  esac
done
[[ -n $bucket ]] || die "--bucket is required (see -h)"
[[ $torch =~ ^(cpu|cuda)$ ]] || die "--torch must be cpu or cuda, not: $torch"
if [[ $dry_run == 0 ]]; then  # pip picks wheels for the machine it runs on: it must be the nodes' kind
  here_is=$(python3.11 -c 'import platform; print(platform.system(), platform.machine())' 2>/dev/null || true)
  [[ $here_is == "Linux x86_64" ]] || die "build the wheelhouse on Linux x86_64 with python3.11, as EMR's nodes \
are (this machine: ${here_is:-no python3.11}); e.g. in an amazonlinux:2023 container"
fi

index=()  # torch's CPU build (2.13.0+cpu) from its own index; the CUDA build is PyPI's
[[ $torch == cpu ]] && index=(--extra-index-url https://download.pytorch.org/whl/cpu)
wheels=${TMPDIR:-/tmp}/raydp_llm-wheelhouse-$torch
run rm -rf "$wheels"
run python3.11 -m pip wheel -q --wheel-dir "$wheels" ${index[@]+"${index[@]}"} "$source_dir"
run aws s3 sync --only-show-errors --delete "$wheels" "s3://$bucket/$prefix/wheelhouse/$torch/"
[[ $dry_run == 1 ]] || echo "$prog: s3://$bucket/$prefix/wheelhouse/$torch/ (create_cluster.sh --wheelhouse)"
