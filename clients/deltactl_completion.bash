# Bash completion for deltactl: commands, each command's flags, -o formats,
# `consumers` verbs, and file names after --json_file=, --out=, --dir=,
# --token_file=, --tls_ca=. The words come from deltactl itself (its hidden
# `__complete` command), so they follow its command table.
#
#   source clients/deltactl_completion.bash      # in ~/.bashrc, say
#
# It completes `deltactl` on the PATH and any path ending in /deltactl
# (bazel-bin/clients/deltactl) that you name with `complete -F _deltactl`.

_deltactl() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  local prev=${COMP_WORDS[COMP_CWORD - 1]}
  local program=${COMP_WORDS[0]}
  COMPREPLY=()

  # --flag=VALUE: bash splits it at '=' (COMP_WORDBREAKS), giving
  # "--flag" "=" "VALUE"; the value being completed may be empty.
  local flag=""
  if [[ $cur == "=" ]]; then
    flag=$prev
    cur=""
  elif [[ $prev == "=" && $COMP_CWORD -ge 2 ]]; then
    flag=${COMP_WORDS[COMP_CWORD - 2]}
  elif [[ $prev == "-o" ]]; then
    flag=--output
  fi
  case $flag in
    --output | -o)
      mapfile -t COMPREPLY < <(compgen -W "text wide json yaml" -- "$cur")
      return 0
      ;;
    --json_file | --out | --dir | --token_file | --tls_ca)
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return 0
      ;;
    --*)
      return 0 # a value deltactl cannot guess
      ;;
  esac

  # The command: the first word that is not a flag or a flag's value.
  local command="" i word
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${COMP_WORDS[i]}
    if [[ $word == "-o" || $word == "=" ]]; then
      i=$((i + 1)) # skip the value
    elif [[ $word != -* ]]; then
      command=$word
      break
    fi
  done

  local words
  words=$("$program" __complete $command 2>/dev/null) || return 0
  if [[ -z $command || $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
  else
    # After the command only its words that are not flags (consumers' verbs).
    mapfile -t COMPREPLY < <(compgen -W "$(grep -v '^-' <<<"$words")" -- "$cur")
  fi
  # A flag that takes a value completes to "--flag=", without a space.
  if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *= ]]; then
    compopt -o nospace 2>/dev/null || true
  fi
  return 0
}

complete -F _deltactl deltactl
