#!/bin/sh
# A fake of JetPack's nvpmodel for tests: the mode in force is the number in the file
# $JOULE_FAKE_NVPMODEL_STATE, the modes' names come from $JOULE_FAKE_NVPMODEL_CONF (nvpmodel.conf
# format). `-q` prints as nvpmodel does; `-m N` switches, except to a mode whose name ends in
# _2CORE, which (like a real mode that takes CPUs offline) asks to reboot and, with no "yes" on
# stdin, changes nothing. Every call is appended to $JOULE_FAKE_NVPMODEL_STATE.log.
set -eu
state=${JOULE_FAKE_NVPMODEL_STATE:?}
conf=${JOULE_FAKE_NVPMODEL_CONF:?}
echo "$*" >>"$state.log"
name_of() {
  sed -n "s/^< POWER_MODEL ID=$1 NAME=\([^ >]*\) >.*/\1/p" "$conf"
}
case "${1:-}" in
  -q)
    id=$(cat "$state")
    echo "NV Power Mode: $(name_of "$id")"
    echo "$id"
    ;;
  -m)
    name=$(name_of "$2")
    if [ -z "$name" ]; then
      echo "NVPM ERROR: Invalid power mode ID $2" >&2
      exit 1
    fi
    case "$name" in
      *_2CORE)
        echo "NVPM WARN: Reboot required for changing to this power mode: $2"
        echo "NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:"
        read -r answer || answer=""
        [ "$answer" = "yes" ] || [ "$answer" = "YES" ] || exit 0
        ;;
    esac
    echo "$2" >"$state"
    ;;
  *)
    echo "usage: nvpmodel -q | -m <mode>" >&2
    exit 1
    ;;
esac
