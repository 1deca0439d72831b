# Sourced first by the launch scripts and tests/run_all.sh, before they do anything: `-h` or
# `--help` as the first argument prints the calling script's leading comment, which is its
# documentation, and exits 0. Without it, `launch/quickstart.sh --help` installed packages,
# rebuilt and deleted its work folder, and `launch/build.sh --help` ran a full build.
# A script that takes no arguments then calls `refuse_arguments "$@"`.
case "${1:-}" in
  -h|--help)
    sed -n '2,${/^#/!q;s/^# \{0,1\}//;p}' "$0"
    exit 0 ;;
esac
refuse_arguments() {
  [ $# -eq 0 ] || { echo "$0 takes no arguments (got: $*); $0 --help says what it does" >&2; exit 2; }
}
