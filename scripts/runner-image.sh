#!/usr/bin/env bash
# Build the runner image (the Dockerfile) and push it where GPU hosts can pull it.
#   scripts/runner-image.sh                     # ghcr.io/tunebot/tunebot-runner:<version>, the bot's default
#   scripts/runner-image.sh ghcr.io/me/runner:1 # your registry; then: export TUNEBOT_RUNNER_IMAGE=ghcr.io/me/runner:1
#   FLASH_ATTN=1 scripts/runner-image.sh ...    # with flash-attention 2; then: export TUNEBOT_RUNNER_FLASH_ATTN=1
#   PUSH=0 scripts/runner-image.sh              # build only
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image=${1:-ghcr.io/tunebot/tunebot-runner:${version}}
docker build --build-arg FLASH_ATTN="${FLASH_ATTN:-0}" -t "$image" .
if [ "${PUSH:-1}" = "1" ]; then
  docker push "$image"
fi
echo "runner image: $image"
