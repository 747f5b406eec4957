# The runner image GPU hosts pull: CUDA PyTorch + the runner extra; `tunebot-runner` is the entry point.
# The bot launches ghcr.io/tunebot/tunebot-runner:<version> by default (bot/settings.py); build and push it,
# or your own name and set TUNEBOT_RUNNER_IMAGE (scripts/runner-image.sh does both):
#   docker build -t ghcr.io/tunebot/tunebot-runner:0.1.0 . && docker push ghcr.io/tunebot/tunebot-runner:0.1.0
#   docker run --gpus all -e TUNEBOT_JOB_SPEC="$(cat job.json)" -e HF_TOKEN -e AWS_ACCESS_KEY_ID ... IMAGE
# The spec comes in TUNEBOT_JOB_SPEC, secrets as environment variables; there is no CMD, so a container
# started without a spec says so and exits 2 instead of printing help and exiting 0.
# The base image's torch is pinned while the extras install (accelerate and transformers need torch >= 2.6),
# so pip never swaps the image's CUDA build for another one. The planner's assumptions hold in this image:
# AdamW is torch's fused CUDA kernel (no extra package); flash-attention 2 is NOT in it unless built with
# --build-arg FLASH_ATTN=1 (then set TUNEBOT_RUNNER_FLASH_ATTN=1 for the bot; attn=flash is refused otherwise);
# without it packed rows attend through torch's own FlashAttention kernel (runner/attention.py).
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

ARG FLASH_ATTN=0
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/home/tunebot/.cache/huggingface \
    TOKENIZERS_PARALLELISM=false

WORKDIR /opt/tunebot
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY bot ./bot
COPY store ./store
RUN python -c "import torch; print('torch==' + torch.__version__)" > /tmp/torch-constraint.txt \
 && pip install -c /tmp/torch-constraint.txt ".[runner]" \
 && (pip install -c /tmp/torch-constraint.txt ".[cuda]" || echo "liger-kernel not installed: the runner trains with torch") \
 && if [ "$FLASH_ATTN" = "1" ]; then pip install -c /tmp/torch-constraint.txt --no-build-isolation flash-attn; fi \
 && useradd --create-home --uid 1000 --shell /usr/sbin/nologin tunebot

LABEL org.opencontainers.image.title="tunebot-runner" \
      org.opencontainers.image.description="tunebot's training runner: LoRA / QLoRA / full fine-tuning from a JobSpec"

# Never train as root: checkpoints and caches belong to an unprivileged user.
USER tunebot
WORKDIR /home/tunebot
ENTRYPOINT ["tunebot-runner"]
