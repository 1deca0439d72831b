# Sourced by the Python test scripts that run under every torch at hand: `pythons` becomes the
# test's own python ($1) and the torch 2.x environment's, where launch/torch2_venv.sh finds one
# (required when SHARDCKPT_REQUIRE_TORCH2=1).
pythons=("$1")
if torch2=$(bash "$(dirname "${BASH_SOURCE[0]}")/../../launch/torch2_venv.sh" --find); then
  pythons+=("$torch2")
elif [ "${SHARDCKPT_REQUIRE_TORCH2:-0}" = 1 ]; then
  echo "the torch 2.x environment is required"; exit 1
fi
