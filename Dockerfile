# The runner image GPU hosts pull: CUDA PyTorch + the runner extra; `tunebot-runner` is the entry point.
#   docker build -t tunebot-runner .
#   docker run --gpus all -e TUNEBOT_JOB_SPEC="$(cat job.json)" -e HF_TOKEN -e AWS_ACCESS_KEY_ID ... tunebot-runner
# The base image's torch is pinned while the extras install (accelerate and transformers need torch >= 2.6),
# so pip never swaps the image's CUDA build for another one.
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

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
 && useradd --create-home --uid 1000 --shell /usr/sbin/nologin tunebot

# Never train as root: checkpoints and caches belong to an unprivileged user.
USER tunebot
WORKDIR /home/tunebot
ENTRYPOINT ["tunebot-runner"]
CMD ["--help"]
