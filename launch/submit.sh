#!/usr/bin/env bash
# Submits a training run to the Ray cluster as a Ray job:
#   ray job submit -- python -m raydp_llm.train +experiment=emr [overrides...]
# through an SSH tunnel to the head node's dashboard (opened and closed here with --head/--key, or one that
# launch/tunnel.sh or `ray dashboard launch/ray/cluster.yaml` keeps open), authenticated with the cluster's
# token (RAY_AUTH_TOKEN, or the token file). Everything after `--` goes to the run as Hydra overrides, word for
# word: `ray job submit` quotes each for the head's shell (shlex.join), so quotes, $(...) and [a,b] arrive as typed.
#   launch/submit.sh --head <primary-dns> --key key.pem -- data.path=s3://bucket/corpus/ train.storage_path=s3://bucket/runs
# It follows the job's log until the job ends; Ctrl-C stops following, not the job.
# With --emr-step it submits the same command as an EMR step instead (aws emr add-steps: no SSH, no tunnel,
# no public address), which runs it on the primary node as hadoop; the step's output goes to the cluster's
# log URI:
#   launch/submit.sh --emr-step --cluster raydp-llm -- data.path=s3://bucket/corpus/ train.storage_path=s3://bucket/runs
set -euo pipefail

prog=submit.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  cat <<'EOF'
usage: submit.sh [--head DNS --key KEY.pem] [options] [-- HYDRA_OVERRIDES...]

  --head DNS           the head node; with --key, a tunnel is opened for the submission and closed after
                       (without them: a tunnel must already be open on --port)
  --key FILE           SSH private key of the cluster's key pair
  --user NAME          SSH user (default hadoop; ec2-user for launch/ray/cluster.yaml)
  --port N             local port of the tunnel to the dashboard (default 8265)
  --cluster NAME       the cluster create_cluster.sh made: its token is ~/.ray/raydp_llm/clusters/NAME/auth_token
                       (default: the only cluster there)
  --token-file FILE    the cluster's token file instead; RAY_AUTH_TOKEN, when set, is used instead of either
  --experiment NAME    the Hydra experiment (default emr)
  --submission-id ID   the job's id (default: Ray makes one)
  --runtime-env-json J the job's runtime environment, e.g. '{"env_vars": {"HF_HOME": "/mnt/hf"}}'
  --no-wait            return once the job is submitted (then: ray job logs --follow ID)
  --dry-run            print the commands, one per line, run nothing

  --emr-step           submit as an EMR step (aws emr add-steps) instead of a Ray job: no SSH or tunnel;
                       it returns once the step is queued and prints how to follow it
  --cluster-id ID      the EMR cluster of --emr-step (default: the one create_cluster.sh recorded for
                       --cluster NAME, or the only one recorded)
  --region REGION      AWS region of the EMR cluster (default: the AWS CLI's)
  --app-dir DIR        where bootstrap.sh installed the project on the nodes (default /mnt/raydp_llm)
EOF
}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # die, show, run

head_dns="" key="" user=hadoop port=8265 cluster="" token_file="" experiment=emr
submission_id="" runtime_env="" no_wait=0 dry_run=0 overrides=()
emr_step=0 cluster_id="" region="" app_dir=/mnt/raydp_llm
while [[ $# -gt 0 ]]; do
  case $1 in
    --head) head_dns=${2:?}; shift 2 ;;
    --key) key=${2:?}; shift 2 ;;
    --user) user=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --cluster) cluster=${2:?}; shift 2 ;;
    --token-file) token_file=${2:?}; shift 2 ;;
    --runtime-env-json) runtime_env=${2:?}; shift 2 ;;
    --experiment) experiment=${2:?}; shift 2 ;;
    --submission-id) submission_id=${2:?}; shift 2 ;;
    --no-wait) no_wait=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --emr-step) emr_step=1; shift ;;
    --cluster-id) cluster_id=${2:?}; shift 2 ;;
    --region) region=${2:?}; shift 2 ;;
    --app-dir) app_dir=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; overrides=("$@"); break ;;
    *) die "unknown argument: $1 (Hydra overrides go after --; see -h)" ;;
  esac
done
[[ -n $head_dns && -z $key ]] && die "--head needs --key (see -h)"
[[ -z $head_dns && -n $key ]] && die "--key needs --head (see -h)"

# An EMR step: the command, quoted for the primary's shell word by word, run by EMR's command-runner.
submit_step() {
  [[ -n $head_dns || -n $runtime_env || -n $submission_id ]] \
    && die "--emr-step takes no --head, --key, --runtime-env-json or --submission-id (see -h)"
  local clusters=$HOME/.ray/raydp_llm/clusters record found region_opt=() script step_json step_id
  if [[ -z $cluster_id ]]; then
    if [[ -n $cluster ]]; then
      record=$clusters/$cluster/cluster.env
    else
      found=("$clusters"/*/cluster.env)
      [[ ${#found[@]} -gt 1 ]] && die "several clusters in $clusters: pass --cluster NAME or --cluster-id ID"
      record=${found[0]}
    fi
    [[ -r $record ]] || die "no cluster recorded ($record): pass --cluster-id ID"
    cluster_id=$(sed -n 's/^CLUSTER_ID=//p' "$record")
  fi
  [[ -n $region ]] && region_opt=(--region "$region")
  script="cd ~ && export RAY_AUTH_MODE=token PATH=$app_dir/venv/bin:\$PATH && exec python -m raydp_llm.train"
  for word in "+experiment=$experiment" ${overrides[@]+"${overrides[@]}"}; do
    script+=" $(printf '%q' "$word")"
  done
  step_json=$(python3 -c 'import json, sys
print(json.dumps([{"Type": "CUSTOM_JAR", "Name": "raydp_llm train", "ActionOnFailure": "CONTINUE",
                   "Jar": "command-runner.jar", "Args": ["bash", "-c", sys.argv[1]]}]))' "$script")
  local add=(aws emr add-steps --cluster-id "$cluster_id" --steps "$step_json" --query 'StepIds[0]'
    --output text ${region_opt[@]+"${region_opt[@]}"})
  if [[ $dry_run == 1 ]]; then
    show "${add[@]}"
    return
  fi
  step_id=$("${add[@]}")
  echo "$prog: step $step_id queued on $cluster_id; follow it: aws emr describe-step --cluster-id" \
    "$cluster_id --step-id $step_id (its output: the cluster's log URI, steps/$step_id/stdout.gz)"
}
if [[ $emr_step == 1 ]]; then
  submit_step
  exit 0
fi

# Ray's clients send the token only in token mode; they read it from RAY_AUTH_TOKEN (or ~/.ray/auth_token).
if [[ $dry_run == 0 && -z ${RAY_AUTH_TOKEN:-} ]]; then
  clusters=$HOME/.ray/raydp_llm/clusters
  if [[ -z $token_file && -n $cluster ]]; then
    token_file=$clusters/$cluster/auth_token
  elif [[ -z $token_file ]]; then
    found=("$clusters"/*/auth_token)
    [[ ${#found[@]} -gt 1 ]] && die "several clusters in $clusters: pass --cluster NAME"
    token_file=${found[0]}
  fi
  [[ -r $token_file ]] || die "no token: set RAY_AUTH_TOKEN or pass --cluster/--token-file (missing: $token_file)"
  RAY_AUTH_TOKEN=$(<"$token_file")
fi
export RAY_AUTH_TOKEN

dry=()
[[ $dry_run == 1 ]] && dry=(--dry-run)
if [[ -n $head_dns ]]; then
  "$here/tunnel.sh" --head "$head_dns" --key "$key" --user "$user" --port "$port" --background ${dry[@]+"${dry[@]}"}
  trap '"$here/tunnel.sh" --stop --port "$port" ${dry[@]+"${dry[@]}"}' EXIT
fi

job=(ray job submit --address "http://127.0.0.1:$port")
[[ -n $submission_id ]] && job+=(--submission-id "$submission_id")
[[ $no_wait == 1 ]] && job+=(--no-wait)
[[ -n $runtime_env ]] && job+=(--runtime-env-json "$runtime_env")
run env RAY_AUTH_MODE=token "${job[@]}" -- python -m raydp_llm.train "+experiment=$experiment" \
  ${overrides[@]+"${overrides[@]}"}
