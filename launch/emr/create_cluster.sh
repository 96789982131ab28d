#!/usr/bin/env bash
# Creates an EMR cluster that runs Ray on its nodes (launch/emr/bootstrap.sh), ready for launch/submit.sh:
#   1. makes the cluster's own Ray token (~/.ray/raydp_llm/clusters/NAME/auth_token, mode 0600: one token per
#      cluster, never reused), uploads it, bootstrap.sh and (with --upload-source) the project's source to
#      s3://BUCKET/PREFIX/ (the token to .../clusters/NAME/auth_token, which launch/teardown.sh removes);
#   2. aws emr create-cluster: one primary node (the Ray head), core nodes (and task nodes) as Ray workers,
#      with the bootstrap action, logs to s3://BUCKET/PREFIX/emr-logs/, and an idle auto-termination.
# It prints the new cluster's id and records it beside the token (cluster.env), for submit.sh and teardown.sh.
# With --dry-run it prints the commands, one per line, and calls nothing.
#   launch/emr/create_cluster.sh --name raydp-llm --bucket my-bucket --key-name my-key --core-count 2
# Only EMR's Hadoop is installed, not EMR's Spark: RayDP starts its own Spark (pyspark 3.5.7) on Ray.
set -euo pipefail

prog=create_cluster.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage() {
  cat <<'EOF'
usage: create_cluster.sh --name NAME --bucket BUCKET --key-name KEY [options]

  --name NAME            the cluster's name
  --bucket BUCKET        S3 bucket for the bootstrap action, token, source and EMR's logs
  --key-name KEY         EC2 key pair for SSH to the nodes (user hadoop)
  --prefix PREFIX        folder in the bucket (default raydp_llm)
  --release LABEL        EMR release, 7.1.0 or later for Python 3.11 (default emr-7.13.0)
  --region REGION        AWS region (default: the AWS CLI's)
  --subnet SUBNET_ID     VPC subnet (default: EMR's choice in the default VPC)
  --primary-type TYPE    primary node instance type, the Ray head (default m7i.xlarge)
  --core-type TYPE       core node instance type (default m7i.2xlarge)
  --core-count N         core nodes (default 2)
  --task-type TYPE       task node instance type (default: the core type)
  --task-count N         task nodes (default 0)
  --volume-gb N          a gp3 EBS volume of N GiB on each core and task node, which EMR mounts as /mnt:
                         Ray's session, Spark's shuffle and spill, spilled objects and model copies
                         (default: EMR's default volume for the instance type)
  --idle-timeout SEC     terminate after SEC idle seconds, 60..604800 (default 7200); a running
                         raydp_llm job counts as busy
  --source S3_URI        the project's source on S3 (default s3://BUCKET/PREFIX/raydp_llm-src.tar.gz)
  --upload-source FILE   upload FILE (e.g. from git archive) to --source first
  --wheelhouse S3_URI    the nodes install from these wheels (launch/emr/wheelhouse.sh), with no package
                         index, instead of --source: for a private --subnet with an S3 gateway endpoint
  --token-file FILE      where to write the cluster's new Ray token (default
                         ~/.ray/raydp_llm/clusters/NAME/auth_token); it must not exist yet
  --bootstrap-arg ARG    one more argument for bootstrap.sh (repeat; e.g. --bootstrap-arg --head-cpus
                         --bootstrap-arg 2); see launch/emr/bootstrap.sh -h
  --dry-run              print the commands, one per line, call nothing
EOF
}
# shellcheck source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"  # die, show, run

name="" bucket="" key_name="" prefix=raydp_llm release=emr-7.13.0 region="" subnet=""
primary_type=m7i.xlarge core_type=m7i.2xlarge core_count=2 task_type="" task_count=0 idle_timeout=7200
volume_gb=""
source_uri="" upload_source="" wheelhouse="" token_file="" dry_run=0 ba_extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) name=${2:?}; shift 2 ;;
    --bucket) bucket=${2:?}; shift 2 ;;
    --key-name) key_name=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --release) release=${2:?}; shift 2 ;;
    --region) region=${2:?}; shift 2 ;;
    --subnet) subnet=${2:?}; shift 2 ;;
    --primary-type) primary_type=${2:?}; shift 2 ;;
    --core-type) core_type=${2:?}; shift 2 ;;
    --core-count) core_count=${2:?}; shift 2 ;;
    --task-type) task_type=${2:?}; shift 2 ;;
    --task-count) task_count=${2:?}; shift 2 ;;
    --volume-gb) volume_gb=${2:?}; shift 2 ;;
    --idle-timeout) idle_timeout=${2:?}; shift 2 ;;
    --source) source_uri=${2:?}; shift 2 ;;
    --upload-source) upload_source=${2:?}; shift 2 ;;
    --wheelhouse) wheelhouse=${2:?}; shift 2 ;;
    --token-file) token_file=${2:?}; shift 2 ;;
    --bootstrap-arg) ba_extra+=("${2:?}"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see -h)" ;;
  esac
done
[[ -n $name ]] || die "--name is required (see -h)"
[[ -n $bucket ]] || die "--bucket is required (see -h)"
[[ -n $key_name ]] || die "--key-name is required (see -h)"
[[ $release =~ ^emr-7\.([1-9]|[1-9][0-9])\.[0-9]+$ ]] || die "--release must be emr-7.1.0 or later (Python 3.11), not: $release"
[[ $core_count =~ ^[1-9][0-9]*$ ]] || die "--core-count must be 1 or more, not: $core_count"
[[ $task_count =~ ^[0-9]+$ ]] || die "--task-count must be a whole number, not: $task_count"
[[ -z $volume_gb || $volume_gb =~ ^[1-9][0-9]*$ ]] || die "--volume-gb must be 1 or more, not: $volume_gb"
if ! [[ $idle_timeout =~ ^[0-9]+$ ]] || ((idle_timeout < 60 || idle_timeout > 604800)); then
  die "--idle-timeout must be 60..604800 seconds, not: $idle_timeout"
fi
[[ ${ba_extra[*]-} == *,* ]] && die "--bootstrap-arg values cannot contain commas"

s3=s3://$bucket/$prefix
source_uri=${source_uri:-$s3/raydp_llm-src.tar.gz}
[[ $source_uri == *,* ]] && die "--source cannot contain commas: $source_uri"
if [[ -n $wheelhouse ]]; then
  [[ $wheelhouse == s3://* && $wheelhouse != *,* ]] || die "--wheelhouse takes an s3:// URI without commas, not: $wheelhouse"
  [[ -z $upload_source ]] || die "--wheelhouse or --upload-source, not both: with a wheelhouse the nodes install from it"
fi
safe_name=${name//[^A-Za-z0-9._-]/_}
record_dir=$HOME/.ray/raydp_llm/clusters/$safe_name
token_file=${token_file:-$record_dir/auth_token}
token_uri=$s3/clusters/$safe_name/auth_token
[[ -e $token_file || -e $record_dir/cluster.env ]] && die "a cluster named '$name' has a token already \
($token_file): one token per cluster; tear that cluster down first (teardown.sh removes it) or pick another --name"
if [[ $dry_run == 0 ]]; then  # a new token: 256 random bits, as `ray get-auth-token --generate`
  (umask 077 && mkdir -p "$record_dir" "$(dirname "$token_file")" &&
    python3 -c 'import secrets; print(secrets.token_hex(32), end="")' >"$token_file")
  echo "$prog: new cluster token in $token_file" >&2
fi

ebs=""  # the workers' volume (bootstrap.sh puts Ray's scratch on /mnt)
[[ -n $volume_gb ]] && ebs=",EbsConfiguration={EbsBlockDeviceConfigs=[{VolumeSpecification={VolumeType=gp3,\
SizeInGB=$volume_gb},VolumesPerInstance=1}]}"
groups=("InstanceGroupType=MASTER,InstanceCount=1,InstanceType=$primary_type"
        "InstanceGroupType=CORE,InstanceCount=$core_count,InstanceType=$core_type$ebs")
((task_count > 0)) && groups+=("InstanceGroupType=TASK,InstanceCount=$task_count,InstanceType=${task_type:-$core_type}$ebs")
ec2=KeyName=$key_name
[[ -n $subnet ]] && ec2+=,SubnetId=$subnet
ba_args=(--source "$source_uri")
[[ -n $wheelhouse ]] && ba_args=(--wheelhouse "$wheelhouse")
ba_args+=(--token-uri "$token_uri" ${ba_extra[@]+"${ba_extra[@]}"})
ba_list=$(IFS=,; echo "${ba_args[*]}")
region_opt=()
[[ -n $region ]] && region_opt=(--region "$region")

run aws s3 cp --only-show-errors "$here/bootstrap.sh" "$s3/bootstrap.sh"
run aws s3 cp --only-show-errors "$token_file" "$token_uri"
[[ -n $upload_source ]] && run aws s3 cp --only-show-errors "$upload_source" "$source_uri"
create=(aws emr create-cluster --name "$name" --release-label "$release" --applications Name=Hadoop
  --instance-groups "${groups[@]}" --ec2-attributes "$ec2" --use-default-roles --log-uri "$s3/emr-logs/"
  --bootstrap-actions "Path=$s3/bootstrap.sh,Name=raydp_llm-ray,Args=[$ba_list]"
  --auto-termination-policy "IdleTimeout=$idle_timeout" ${region_opt[@]+"${region_opt[@]}"}
  --query ClusterId --output text)
if [[ $dry_run == 1 ]]; then
  show "${create[@]}"
  exit 0
fi
cluster_id=$("${create[@]}")
# What teardown.sh needs to remove the token again (from S3 and from here), and submit.sh to find it.
printf '%s\n' "CLUSTER_ID=$cluster_id" "TOKEN_URI=$token_uri" "TOKEN_FILE=$token_file" >"$record_dir/cluster.env"
echo "$cluster_id"
