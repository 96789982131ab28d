# shellcheck shell=bash
# What the client scripts (create_cluster.sh, tunnel.sh, submit.sh, teardown.sh) share; sourced, not run.
# The sourcing script sets `prog` (its name, for errors) and `dry_run` (1: print commands, run nothing).
# shellcheck disable=SC2154  # prog and dry_run are the sourcing script's

die() { echo "$prog: error: $*" >&2; exit 2; }

# Print a command as one line that a shell reads back as the same words.
show() {
  local out="" a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
  done
  printf '%s\n' "${out# }"
}

# Run a command, or with --dry-run print it.
run() { if [[ $dry_run == 1 ]]; then show "$@"; else "$@"; fi; }
