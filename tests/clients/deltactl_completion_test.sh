#!/bin/bash
# clients/deltactl_completion.bash, sourced as a user would, completes
# deltactl's commands, a command's flags, -o formats and consumers' verbs
# from the real binary.
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-__main__}"
deltactl="${root}/clients/deltactl"
source "${root}/clients/deltactl_completion.bash"

complete -p deltactl | grep -q -- '-F _deltactl' ||
  { echo "deltactl has no completion: $(complete -p deltactl)"; exit 1; }
complete -F _deltactl "${deltactl}"

# The completions of the command line "$@", the last word being completed.
completions() {
  COMP_WORDS=("${deltactl}" "$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  _deltactl
  echo "${COMPREPLY[*]}"
}

failures=0
expect() {
  local want=$1
  shift
  local got
  got=$(completions "$@")
  if [[ $got != "$want" ]]; then
    echo "deltactl $* <TAB>: got '${got}', want '${want}'"
    failures=$((failures + 1))
  fi
}

expect "step status snapshot subscribe" s
expect "commit consumers compact" co
expect "--consumer= --count=" subscribe --co
expect "--consumer=" --target=h:1 get --cons
expect "--interval_ms=" watch --i
expect "" step --cons             # step takes no --consumer
expect "add" consumers a
expect "yaml" status -o y
expect "wide" status --output = w
expect "--target= --timeout_ms= --token_file= --tls_ca=" status --t
# The same words through compgen, as bash's own completion would ask.
words=$("${deltactl}" __complete chain)
[[ $(compgen -W "${words}" -- --d) == "--dir=" ]] ||
  { echo "compgen over chain's words: $(compgen -W "${words}" -- --d)"; failures=$((failures + 1)); }

if ((failures > 0)); then
  echo "${failures} completion(s) wrong"
  exit 1
fi
echo "PASS"
