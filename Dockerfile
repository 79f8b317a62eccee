# syntax=docker/dockerfile:1
# tokshard images, installed exactly as the README and CI install (.ci/setup):
#   docker build --target cpu -t tokshard:cpu .   # preprocessing nodes: no CUDA, CPU torch
#   docker build --target gpu -t tokshard:gpu .   # trainers: CUDA PyTorch base image
#   docker run --rm -v "$PWD/data:/data" tokshard:cpu prepare wikitext-103 --out /data/wt103
#   docker run --rm tokshard:cpu demo --out /tmp/demo   # the whole job, offline, in about two minutes

# --- cpu: build in a full image, run in a slim one ------------------------------------
FROM python:3.11-bookworm AS cpu-build
WORKDIR /opt/tokshard
# CPU wheels of torch come from PyTorch's CPU index (PyPI's default build carries CUDA).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_NO_CACHE_DIR=1
COPY . .
RUN TORCH_SPEC="torch==2.13.0" EXTRAS="hpc" .ci/setup

FROM python:3.11-slim-bookworm AS cpu
WORKDIR /opt/tokshard
COPY --from=cpu-build /opt/tokshard /opt/tokshard
ENV PATH=/opt/tokshard/.venv/bin:$PATH \
    HF_HOME=/cache/huggingface \
    PYTHONUNBUFFERED=1
VOLUME ["/cache"]
ENTRYPOINT ["tokshard"]
CMD ["--help"]

# --- gpu: keep the base image's CUDA build of torch --------------------------------------
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-devel AS gpu
WORKDIR /opt/tokshard
ENV PIP_NO_CACHE_DIR=1 \
    HF_HOME=/cache/huggingface \
    PYTHONUNBUFFERED=1
COPY . .
RUN TORCH_SPEC=none VENV_FLAGS=--system-site-packages EXTRAS="transformers" PYTHON=python .ci/setup
ENV PATH=/opt/tokshard/.venv/bin:$PATH
VOLUME ["/cache"]
ENTRYPOINT ["tokshard"]
CMD ["--help"]
