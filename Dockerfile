# The runner image GPU hosts pull: CUDA PyTorch + the runner extra; `tunebot-runner` is the entry point.
#   docker build -t tunebot-runner .
#   docker run --gpus all -e TUNEBOT_JOB_SPEC="$(cat job.json)" -e HF_TOKEN -e AWS_ACCESS_KEY_ID ... tunebot-runner
# The base image's torch (CUDA 12.4) satisfies the runner extra's torch requirement, so pip keeps it.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

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
RUN pip install ".[runner]" \
 && useradd --create-home --uid 1000 --shell /usr/sbin/nologin tunebot

# Never train as root: checkpoints and caches belong to an unprivileged user.
USER tunebot
WORKDIR /home/tunebot
ENTRYPOINT ["tunebot-runner"]
CMD ["--help"]
